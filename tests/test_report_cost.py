"""scripts/report/cost.py's experiments end to end at tiny sizes (figure, rows, grid points and verdict written, threads
restored), the FLOP counts against a formula written out, the work-span model and the verdict on fake numbers, the
autograd depths, the peak-memory measure against allocations of known size, and the KV cache's bytes. No wall-clock
asserts."""
import json

import pytest
import torch
import torch.nn.functional as F

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from attnlab.runtime import peak_bytes
from model import KVCache, manual_attention
from scripts.report import Context, cost

CPU = torch.device("cpu")


def tiny_context(tmp_path, monkeypatch, **budget):
    monkeypatch.setitem(cost.BUDGET, "quick", {**cost.BUDGET["quick"], **budget})
    ctx = Context("quick", CPU, tmp_path, hardware="test CPU")
    return ctx


def rows(ctx, experiment):
    return {r["measure"]: r for r in ctx.rows if r["experiment"] == experiment}


@pytest.mark.parametrize("width", [64, 256, 512])
def test_flops_per_token_match_the_formula_and_the_gpt_does_more_at_the_lengths_measured(width):
    configs = cost.throughput_models(width, 1024)
    gpt, lstm = (build_model(configs[name]) for name in ("gpt", "lstm"))
    L, C, hs, V = configs["gpt"].n_layer, configs["gpt"].n_embd, configs["gpt"].head_size, 96
    assert hs == 64
    # per block: qkv and output projections 4C², MLP 8C², two RMSNorms and the QK-norms; then ln_f and the tied head
    gpt_weights = L * (12 * C * C + 2 * C + 2 * hs) + C + V * C
    H = configs["lstm"].n_embd
    lstm_weights = configs["lstm"].n_layer * 4 * (2 * H * H + 2 * H) + V * H  # gates x (W_ih, W_hh, b_ih, b_hh)
    assert abs(gpt.num_params() / lstm.num_params() - 1) < 0.01
    for T in (1, 64, 1024):
        assert gpt.flops_per_token(T) == 6 * gpt_weights + 12 * L * C * T
        assert lstm.flops_per_token(T) == 6 * lstm_weights
    # 6N is equal within the 1% of the sizes' match; attention's 12·L·C·T outweighs that from a few tokens on
    assert all(gpt.flops_per_token(T) > lstm.flops_per_token(T) for T in range(64, 1025))


def test_work_span_model_gives_the_step_time_written_out():
    flops, span = (lambda T: 1000.0 + T), (lambda T: 10 * T)
    # W = 100 tokens x 1064 FLOPs at T=64; P f = 4 x 100 FLOP/s; S τ = 640 x 0.5 s: a step of 266 + 320 s
    assert cost.work_span(flops, span, 100, 64, 100.0, 0.5, processors=4) == pytest.approx(100 / (266 + 320))
    configs = cost.throughput_models(64, 128)
    S = cost.spans(configs, dict(gpt=44, lstm=8))
    assert S["gpt"](1) == S["gpt"](1024) == 2 * 4 * 44  # forward and back through 4 blocks, all positions at once
    assert S["lstm"](1024) == 2 * (1024 + 1) * 8  # a wavefront over 2 layers: T + 1 cell steps, each way


def test_autograd_depths_count_a_block_and_a_cell_step_once():
    cfg = cost.throughput_models(64, 128)["gpt"]
    depth = cost.block_depth(cfg)
    assert 20 < depth < 100  # a block's norms, projections, RoPE, attention, MLP and residuals; constant in T
    assert cost.lstm_step_depth(16) == cost.lstm_step_depth(32) > 1  # a cell step's depth does not grow with width


def test_verdict_is_shown_only_where_the_gpt_is_faster_at_every_realistic_point():
    evidence, status = cost.throughput_verdict({(256, 64): 0.8, (512, 1024): 0.5}, 0.4, "d=512, T=1024")
    assert status == "shown here"
    assert "0.50-0.80 (min-max over 2 (d, T) points; the GPT faster at 2)" in evidence and "= 0.40" in evidence
    evidence, status = cost.throughput_verdict({(256, 64): 1.6, (512, 1024): 0.9}, 0.4, "d=512, T=1024")
    assert status == "not shown here"  # a 2-thread CPU is not the parallel hardware: never "contradicted"
    assert "the GPT faster at 1" in evidence
    assert cost.throughput_verdict({(256, 64): 2.0}, 3.0, "x")[1] == "not shown here"


def gpu_results(**rates):
    """A gpu.py results.json's fields from {model_T: tokens/s}, e.g. gpt_256=1e6."""
    throughput = [dict(model=key.split("_")[0], T=int(key.split("_")[1]), tokens_per_s=v) for key, v in rates.items()]
    return dict(hardware="GPU test", date="2026-12-02", smoke=False, note="checked on a GPU", throughput=throughput)


def test_a_gpu_run_decides_both_ways_and_a_partial_one_stays_undecided():
    shown = cost.gpu_verdict(gpu_results(gpt_256=2e6, lstm_256=1e6, gpt_4096=3e6, lstm_4096=1e5), "cpu numbers")
    assert shown[1] == "shown here" and "0.03-0.50 (min-max over 2 lengths; the GPT faster at 2; checked" in shown[0]
    assert "on this CPU: cpu numbers" in shown[0]
    assert cost.gpu_verdict(gpu_results(gpt_256=1e6, lstm_256=2e6), "")[1] == "contradicted here"  # parallel hardware
    assert cost.gpu_verdict(gpu_results(gpt_256=1e6, lstm_256=2e6, gpt_512=2e6, lstm_512=1e6), "")[1] == (
        "not shown here")


def test_throughput_reads_a_gpu_run_but_not_a_smoke_one(tmp_path, monkeypatch):
    ctx = tiny_context(tmp_path, monkeypatch, widths=(256,), lengths=(8,), tokens=8, threads=1, repeats=1)
    monkeypatch.setattr(cost, "GPU_RESULTS", tmp_path / "results.json")
    cost.GPU_RESULTS.write_text(json.dumps({**gpu_results(gpt_256=2e6, lstm_256=1e6), "smoke": True}))
    cost.exp_throughput(ctx)
    assert "GPU test" not in ctx.verdicts[-1]["evidence"]
    if ctx.verdicts[-1]["status"] == "not shown here":
        assert ctx.verdicts[-1]["evidence"].endswith("needs a GPU: python -m scripts.report.gpu")
    cost.GPU_RESULTS.write_text(json.dumps(gpu_results(gpt_256=2e6, lstm_256=1e6)))
    cost.exp_throughput(ctx)
    assert ctx.verdicts[-1]["status"] == "shown here" and "measured on GPU test" in ctx.verdicts[-1]["evidence"]


def test_peak_bytes_sees_a_known_allocation():
    n = 10_000_000

    def allocate():
        block = torch.ones(n, dtype=torch.uint8)
        del block
        torch.ones(n // 2, dtype=torch.uint8)  # after the first is freed: the peak is the larger one, not the sum

    assert n <= peak_bytes(allocate, CPU) < 1.5 * n


def test_peak_bytes_sees_the_weights_that_manual_attention_holds_and_fused_attention_does_not():
    T, heads = 1024, 4
    q, k, v = (torch.randn(1, heads, T, 64, requires_grad=True) for _ in range(3))
    weights = heads * T * T * 4  # (B, nh, T, T) in fp32
    manual = peak_bytes(lambda: manual_attention(q, k, v, None, True)[0].sum().backward(), CPU)
    q.grad = k.grad = v.grad = None
    fused = peak_bytes(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward(), CPU)
    assert manual >= 2 * weights > weights > fused  # scores and weights, against O(T) buffers


def test_throughput_writes_its_figure_rows_grid_and_verdict_and_restores_the_threads(tmp_path, monkeypatch):
    ctx = tiny_context(tmp_path, monkeypatch, widths=(64, 256), lengths=(8, 16), tokens=32, threads=1, repeats=1)
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # a count the experiment does not use, so that restoring it is seen
    try:
        cost.exp_throughput(ctx)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    assert (tmp_path / "throughput.png").exists()
    found = rows(ctx, "throughput")
    flops = found["training FLOPs per token at d=256, T=8 / T=16"]
    gpt = build_model(cost.throughput_models(256, 16)["gpt"])
    assert flops["gpt"].split(" / ")[1] == f"{gpt.flops_per_token(16) / 1e6:.2f}M"
    for d in (64, 256):
        for T, B in ((8, 4), (16, 2)):
            row = found[f"training tokens/s, d={d}, T={T} (batch {B}), 1 thread"]
            gpt_rate, lstm_rate = (float(row[side].replace(",", "")) for side in ("gpt", "lstm"))
            assert gpt_rate > 0 and lstm_rate > 0
            ratio = float(row["note"].split(";")[0].removeprefix("LSTM/GPT = "))
            assert ratio == pytest.approx(lstm_rate / gpt_rate, rel=0.02, abs=0.01)  # from the unrounded rates
    assert len([g for g in ctx.grid if g["experiment"] == "throughput"]) == 2 * 2 * 2  # widths x models x lengths
    model_row = next(r for m, r in found.items() if m.startswith("work-span model (not measured), d=256, T=16"))
    assert "2 x 4 blocks x" in model_row["note"]
    [verdict] = ctx.verdicts
    assert verdict["reason"] == "a" and verdict["status"] in ("shown here", "not shown here")
    assert "over 2 (d, T) points" in verdict["evidence"]  # d=64 is below REALISTIC and not read


def test_long_measures_every_path_or_says_it_skipped_it(tmp_path, monkeypatch):
    monkeypatch.setattr(cost, "WINDOW", 8)  # narrower than the lengths: the banded path runs
    ctx = tiny_context(tmp_path, monkeypatch, long_lengths=(16, 32), long_rounds=1)
    cost.exp_long(ctx)
    assert (tmp_path / "long.png").exists()
    found = rows(ctx, "long")
    time_row = found["one layer forward+backward at T=32, ms: manual / fused SDPA / window 8"]
    memory_row = found["one layer forward+backward at T=32, peak MiB: manual / fused SDPA / window 8"]
    for row in (time_row, memory_row):
        assert all(float(v) > 0 for v in row["gpt"].split(" / ") + [row["lstm"]])

    ctx = tiny_context(tmp_path, monkeypatch, long_lengths=(16, 32), long_rounds=1, memory_cap=1)
    cost.exp_long(ctx)  # every path's first point already passes one byte: all stop after it
    time_row = rows(ctx, "long")["one layer forward+backward at T=32, ms: manual / fused SDPA / window 8"]
    assert (time_row["gpt"], time_row["lstm"]) == ("skipped / skipped / skipped", "skipped")
    assert "manual skipped from T=32 (predicted peak over" in time_row["note"]


def test_generation_carries_a_growing_cache_a_capped_window_and_a_constant_state(tmp_path, monkeypatch):
    monkeypatch.setattr(cost, "WINDOW", 8)
    ctx = tiny_context(tmp_path, monkeypatch, contexts=(4, 16, 32), new_tokens=2)
    cost.exp_generation(ctx)
    assert (tmp_path / "generation.png").exists()
    row = rows(ctx, "generation")["bytes carried per sequence after 32 tokens"]
    cfg = ModelConfig()  # the default GPT: 4 layers, 4 heads of 48
    per_token = 2 * cfg.n_layer * cfg.kv_heads * cfg.head_size * 4
    assert row["gpt"] == f"{per_token * 32:,}; window 8: {per_token * 8:,}"
    lstm = cost.lstm_preset(96)
    assert row["lstm"] == f"{2 * lstm.n_layer * lstm.n_embd * 4:,}"  # h and c of every layer


@pytest.mark.parametrize("n_kv_head, dtype, window", [(None, torch.float32, 0), (1, torch.bfloat16, 0),
                                                      (None, torch.float32, 100)])
def test_kv_cache_bytes_match_the_formula(n_kv_head, dtype, window):
    cfg = ModelConfig(n_layer=3, n_head=4, n_kv_head=n_kv_head, n_embd=64, block_size=256, window=window)
    for T in (1, 100, 256):
        cache = KVCache(cfg, 2, T, "cpu", dtype)
        held = min(T, window or T)  # a windowed cache keeps the last `window` tokens only
        assert cache.nbytes == 2 * 2 * cfg.n_layer * cfg.kv_heads * cfg.head_size * held * dtype.itemsize  # K, V; B=2
