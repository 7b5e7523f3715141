"""scripts/report/cost.py's experiments end to end at tiny sizes (figures and rows written) and the KV cache's bytes.
No wall-clock asserts."""
from dataclasses import replace

import pytest
import torch

from attnlab.config import ModelConfig
from model import KVCache
from scripts.report import Context, cost, tasks

CPU = torch.device("cpu")


def tiny_context(tmp_path, monkeypatch, **budget):
    monkeypatch.setitem(cost.BUDGET, "quick", replace(cost.BUDGET["quick"], **budget))
    ctx = Context("quick", CPU, tmp_path, hardware="test CPU")
    return ctx


def rows(ctx, experiment):
    return {r["measure"]: r for r in ctx.rows if r["experiment"] == experiment}


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
    lstm = tasks.lstm_preset(96)
    assert row["lstm"] == f"{2 * lstm.n_layer * lstm.n_embd * 4:,}"  # h and c of every layer


@pytest.mark.parametrize("n_kv_head, dtype, window", [(None, torch.float32, 0), (1, torch.bfloat16, 0),
                                                      (None, torch.float32, 100)])
def test_kv_cache_bytes_match_the_formula(n_kv_head, dtype, window):
    cfg = ModelConfig(n_layer=3, n_head=4, n_kv_head=n_kv_head, n_embd=64, block_size=256, window=window)
    for T in (1, 100, 256):
        cache = KVCache(cfg, 2, T, "cpu", dtype)
        held = min(T, window or T)  # a windowed cache keeps the last `window` tokens only
        assert cache.nbytes == 2 * 2 * cfg.n_layer * cfg.kv_heads * cfg.head_size * held * dtype.itemsize  # K, V; B=2
