"""scripts/report/parallel.py: the rule's three outcomes on synthetic numbers, FLOPs per token matched across the
models, batch = tokens / T, the part end to end at tiny sizes, a GPU run's verdict; and timing.time_steps, the one
way scripts/bench.py and the report time a training step. No wall-clock asserts."""
import json

import pytest
import torch

import scripts.bench as bench
import scripts.timing as timing
from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from scripts.report import Context, parallel

CPU = torch.device("cpu")
TINY = parallel.Budget(width=32, n_layer=1, window=4, lengths=(4, 16), step_lengths=(4, 16), tokens=16, rounds=2)


def has_mingru():
    try:
        build_model(ModelConfig(type="mingru", vocab_size=8, block_size=8, n_layer=1, n_embd=8))
    except ValueError:
        return False
    return hasattr(build_model(ModelConfig(type="mingru", vocab_size=8, block_size=8, n_layer=1, n_embd=8)), "scan")


requires_mingru = pytest.mark.skipif(not has_mingru(), reason="attnlab/rnn.py has no minGRU with RNN.scan yet")


def synthetic(seconds_of, lengths=(64, 4096), tokens=4096, rounds=4):
    """A Parallel whose seconds per step come from seconds_of(name, T, threads) (one value, every round)."""
    configs = {name: ModelConfig(n_embd=64) for name in ("gpt", "lstm", "mingru")}  # read by the figure only
    seconds = {(name, T, threads): [seconds_of(name, T, threads)] * rounds for name in (*configs, parallel.STEPS)
               for T in lengths for threads in parallel.THREADS}
    flops = {name: 1e6 for name in (*configs, parallel.STEPS)}
    return parallel.Parallel(configs, {name: 1000 for name in configs}, flops, lengths, tokens, seconds)


def attention_keeps(name, T, threads):
    """The GPT as fast at batch 1 and twice as fast on 2 threads; the LSTM 4x slower at batch 1, no thread speedup."""
    if name == "gpt":
        return 1.0 / threads
    return 4.0 if T == 4096 else 1.0


def test_the_rule_decides_all_three_ways_from_the_rounds():
    assert parallel.decide({"gpt": [0.9, 0.8, 1.0], "lstm": [0.3, 0.2, 0.4]}, [0.5, 0.4, 0.6]) == "shown here"
    # the LSTM keeping more of its FLOP/s and of its thread speedup than the GPT, beyond the rounds' quartiles
    assert parallel.decide({"gpt": [0.3, 0.2, 0.4], "lstm": [0.9, 0.8, 1.0]}, [-0.5, -0.4, -0.6]) == (
        "contradicted here")
    assert parallel.decide({"gpt": [0.9, 0.8, 1.0], "lstm": [0.6, 0.7, 0.8]}, [0.5, 0.4, 0.6]) == "not shown here"
    # a gap whose lower quartile reaches 0: the speedups are not told apart
    assert parallel.decide({"gpt": [0.9, 0.8, 1.0], "lstm": [0.3, 0.2, 0.4]}, [0.5, -0.4, -0.6, 0.4]) == (
        "not shown here")
    assert str(parallel.KEEPS) in parallel.RULE and str(parallel.FALLS) in parallel.RULE


def test_per_round_ratios_read_the_seconds_by_rule():
    p = synthetic(attention_keeps)
    assert p.kept("gpt") == [1.0] * 4 and p.kept("lstm") == [0.25] * 4  # FLOP/s at batch 1 over at batch 64
    assert p.speedup("gpt", 4096) == [2.0] * 4 and p.gap() == [1.0] * 4
    assert p.rates("lstm", 64, 1) == [1e6 * 4096 / 1.0] * 4


@requires_mingru
@pytest.mark.parametrize("preset", ["quick", "full"])
def test_the_models_do_equal_flops_per_token_at_every_length_and_the_gpt_keeps_its_window(preset):
    budget = parallel.BUDGET[preset]
    configs = parallel.parallel_models(budget)
    models = {name: build_model(cfg) for name, cfg in configs.items()}
    assert configs["gpt"].window == budget.window <= min(budget.lengths)
    for T in budget.lengths:
        gpt = models["gpt"].flops_per_token(T)
        assert gpt == models["gpt"].flops_per_token(budget.window)  # constant in T past the window
        for name in ("lstm", "mingru"):
            assert models[name].flops_per_token(T) == pytest.approx(gpt, rel=0.02)
    assert budget.lengths[-1] == budget.tokens and budget.rounds >= 10  # batch 1 at the end; 10 rounds


def test_a_gpu_run_adds_its_own_verdict_and_a_smoke_run_does_not(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "GPU_RESULTS", tmp_path / "results.json")
    results = dict(hardware="GPU test", date="2026-12-02", smoke=True, note="checked on a GPU",
                   throughput=[dict(model="gpt", T=256, tokens_per_s=2e6), dict(model="lstm", T=256, tokens_per_s=1e6)])
    parallel.GPU_RESULTS.write_text(json.dumps(results))
    ctx = Context("quick", CPU, tmp_path, hardware="test CPU")
    parallel.decide_parallel(ctx, synthetic(attention_keeps))
    [verdict] = ctx.verdicts
    assert verdict["status"] == "shown here" and verdict["rule"] == parallel.RULE
    assert "GPT 1.00 [1.00-1.00], LSTM 0.25 [0.25-0.25]" in verdict["evidence"]
    parallel.GPU_RESULTS.write_text(json.dumps({**results, "smoke": False}))
    parallel.decide_parallel(ctx, synthetic(lambda name, T, threads: 1.0))  # no batch or thread effect at all
    cpu, gpu = ctx.verdicts[1:]
    assert cpu["status"] == "not shown here"
    assert gpu["status"] == "shown here" and gpu["rule"] == parallel.GPU_RULE and "GPU test" in gpu["evidence"]
    slower = [dict(model="gpt", T=256, tokens_per_s=1e6), dict(model="lstm", T=256, tokens_per_s=2e6)]
    assert parallel.gpu_verdict({**results, "throughput": slower})[1] == "contradicted here"
    assert parallel.gpu_verdict({**results, "throughput": slower + [dict(model="gpt", T=512, tokens_per_s=2e6),
                                                                     dict(model="lstm", T=512, tokens_per_s=1e6)]}
                                )[1] == "not shown here"


@requires_mingru
def test_bench_and_the_report_time_their_steps_with_the_same_timer(tmp_path, monkeypatch, capsys):
    used = []

    def recording(steps, rounds, device, **kwargs):
        used.append(sorted(map(str, steps)))
        return timing.time_steps(steps, rounds, device, **kwargs)

    assert bench.time_steps is parallel.time_steps is timing.time_steps
    monkeypatch.setattr(bench, "time_steps", recording)
    monkeypatch.setattr(parallel, "time_steps", recording)
    bench.main(["--quick", "--only", "train"])
    assert "| GPT-2 124M |" in capsys.readouterr().out
    monkeypatch.setitem(parallel.BUDGET, "quick", TINY)
    parallel.exp_parallel(Context("quick", CPU, tmp_path, hardware="test CPU"))
    assert len(used) == 2 and "('gpt', 16, 2)" in used[1]


@requires_mingru
def test_parallel_writes_rows_figure_grid_and_verdict_at_batch_tokens_over_t(tmp_path, monkeypatch):
    monkeypatch.setitem(parallel.BUDGET, "quick", TINY)
    monkeypatch.setattr(parallel, "GPU_RESULTS", tmp_path / "absent.json")
    shapes, train_step = [], parallel.train_step

    def recording(model, optimizer, batches, **kwargs):
        shapes.append((type(model).__name__, getattr(model, "scan", None), tuple(batches[0][0].shape),
                       torch.get_num_threads()))
        return train_step(model, optimizer, batches, **kwargs)

    monkeypatch.setattr(parallel, "train_step", recording)
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # a count the part does not use, so that restoring it is seen
    try:
        ctx = Context("quick", CPU, tmp_path, hardware="test CPU")
        parallel.exp_parallel(ctx)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    assert {(B, T) for _, _, (B, T), _ in shapes} == {(4, 4), (1, 16)}  # batch = tokens / T
    assert {(name, scan, threads) for name, scan, _, threads in shapes} == {
        ("GPT", None, 1), ("GPT", None, 2), ("RNN", True, 1), ("RNN", True, 2), ("RNN", False, 1)}
    per_point = 1 + 1 + TINY.rounds  # warm-up, sizing step, rounds
    assert len(shapes) == per_point * 2 * (3 * 2 + 1)  # lengths x (3 models x 2 thread counts + the minGRU's steps)
    assert (tmp_path / "parallel.png").exists()
    found = {r["measure"]: r for r in ctx.rows}
    flops = found["training FLOPs per token (T >= window 4)"]
    assert all(flops[side].endswith("M") for side in ("gpt", "lstm", "mingru"))
    for T, B in ((4, 4), (16, 1)):
        row = found[f"training GFLOP/s at 1 / 2 threads (2-thread speedup), T={T}, batch {B}"]
        assert all(float(row[side].split(" / ")[0]) > 0 for side in ("gpt", "lstm", "mingru"))
        assert found[f"minGRU training step, step by step over the scan, T={T}, batch {B}"]["mingru"].startswith("x")
    assert len(ctx.grid) == 2 * 7
    [verdict] = ctx.verdicts
    assert verdict["reason"] == "a" and verdict["rule"] == parallel.RULE
    assert verdict["status"] in ("shown here", "not shown here", "contradicted here")
    assert "over 2 rounds" in verdict["evidence"]
