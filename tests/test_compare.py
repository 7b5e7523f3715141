"""compare.py's measuring tools: the synthetic tasks, equal sizes, the counts behind Table 1, the KV cache's bytes,
one short seeded run where the GPT learns recall (so the demonstration cannot rot), and the language-model
experiment end to end on tiny models (train.py runs, then the plots read their checkpoints). No wall-clock asserts."""
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint import build_model
from config import ModelConfig
from conftest import words_corpus
from model import GPT, KVCache
from report import Context, lm
from report.mechanism import autograd_depth, gradient_paths, max_hops
from report.tasks import induction_batch, recall_batch, rnn_width, synthetic_models, train_synthetic
from runlog import read_metrics


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16]), st.integers(0, 2**31))
def test_recall_targets_are_the_values_of_the_queried_keys(n_pairs, seed):
    x, y = recall_batch(8, n_pairs, generator=torch.Generator().manual_seed(seed))
    assert x.shape == y.shape == (8, 64)
    for row, target in zip(x.tolist(), y.tolist()):
        keys, values = row[0:2 * n_pairs:2], row[1:2 * n_pairs:2]
        assert len(set(keys)) == n_pairs and all(1 <= k <= 16 for k in keys) and all(17 <= v <= 32 for v in values)
        queries = [t for t, v in enumerate(target) if v >= 0]
        assert queries == list(range(2 * n_pairs, 3 * n_pairs))  # every key asked once, right after the pairs
        assert sorted(row[t] for t in queries) == sorted(keys)
        assert all(target[t] == values[keys.index(row[t])] for t in queries)
        assert row[3 * n_pairs:] == [0] * (64 - 3 * n_pairs)


def test_recall_rejects_impossible_sizes():
    with pytest.raises(ValueError, match="pairs"):
        recall_batch(2, 17)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31))
def test_induction_targets_are_the_next_token_of_the_repeat(seed):
    x, y, lengths = induction_batch(8, generator=torch.Generator().manual_seed(seed))
    for row, target, S in zip(x.tolist(), y.tolist(), lengths.tolist()):
        assert 8 <= S <= 32
        first, second = row[:S], row[S:2 * S]
        assert first == second and len(set(first)) == S and 0 not in first and row[2 * S:] == [0] * (64 - 2 * S)
        scored = [t for t, v in enumerate(target) if v >= 0]
        assert scored == list(range(S, 2 * S - 1))  # inside the second copy, each with an earlier copy to look up
        assert all(target[t] == row[t + 1] for t in scored)


def test_synthetic_models_have_equal_size():
    configs = synthetic_models(33, 64)
    gpt, lstm = (build_model(configs[name]).num_params() for name in ("gpt", "lstm"))
    assert configs["gpt"].n_layer == configs["lstm"].n_layer == 2 and abs(lstm / gpt - 1) < 0.01


@pytest.mark.parametrize("type, gates, tied", [("lstm", 4, False), ("gru", 3, True), ("lstm", 4, True)])
def test_rnn_width_counts_parameters_like_the_model(type, gates, tied):
    width = rnn_width(200_000, 50, n_layer=3, gates=gates, tied=tied)
    model = build_model(ModelConfig(type=type, vocab_size=50, n_layer=3, n_embd=width, tie_weights=tied))
    count = lambda h: 50 * h * (1 if tied else 2) + 3 * gates * (2 * h * h + 2 * h)
    assert model.num_params() == count(width)
    assert abs(count(width) - 200_000) <= min(abs(count(width + 1) - 200_000), abs(count(width - 1) - 200_000))


@pytest.mark.parametrize("n_kv_head, dtype", [(None, torch.float32), (1, torch.bfloat16)])
def test_kv_cache_bytes_match_the_formula(n_kv_head, dtype):
    cfg = ModelConfig(n_layer=3, n_head=4, n_kv_head=n_kv_head, n_embd=64, block_size=256)
    for T in (1, 100, 256):
        cache = KVCache(cfg, 2, T, "cpu", dtype)
        assert cache.nbytes == 2 * 2 * cfg.n_layer * cfg.kv_heads * cfg.head_size * T * dtype.itemsize  # K, V; B=2


def test_sequential_steps_constant_for_attention_linear_for_recurrence():
    block = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=256)).transformer.h[0]
    depth = lambda T: autograd_depth(block(torch.randn(1, T, 16, requires_grad=True))[0].sum())
    assert depth(8) == depth(64) == depth(256)
    cell = torch.nn.LSTMCell(16, 16)

    def lstm_depth(T):
        h = c = torch.zeros(1, 16)
        for x in torch.randn(T, 1, 16, requires_grad=True):
            h, c = cell(x, (h, c))
        return autograd_depth(h.sum())

    per_step = lstm_depth(9) - lstm_depth(8)
    assert per_step > 0 and lstm_depth(64) - lstm_depth(8) == 56 * per_step
    assert max_hops(4096, lambda i, n: range(i + 1, n)) == 1
    assert max_hops(4096, lambda i, n: [i + 1] if i + 1 < n else []) == 4095


@pytest.mark.slow
def test_gpt_learns_recall_in_a_short_seeded_run():
    torch.manual_seed(0)
    evals = {4: recall_batch(256, 4, generator=torch.Generator().manual_seed(1))}
    make = lambda it, g: recall_batch(64, 4, generator=g)
    _, curve = train_synthetic(synthetic_models(33, 64)["gpt"], make, 300, 3e-3, evals, torch.device("cpu"),
                               stop_at=0.97)
    assert curve[-1][1][4] >= 0.95, curve


@pytest.mark.slow
def test_lm_experiment_trains_both_models_with_train_py(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the runs (out/compare) and the prepared corpus (data/prepared) are relative paths
    tiny = ["model.n_embd=16", "model.block_size=16", "train.batch_size=4"]
    monkeypatch.setattr(lm, "LM_MODELS", {"gpt": ["model.n_layer=1", "model.n_head=2", *tiny],
                                               "lstm": ["model=lstm", "model.n_layer=1", *tiny]})
    corpus = words_corpus(tmp_path / "corpus.txt")
    monkeypatch.setitem(lm.BUDGET, "quick", {**lm.BUDGET["quick"], "lm_seconds": 0})  # the fewest iterations: 20
    ctx = Context("quick", torch.device("cpu"), tmp_path / "report", str(corpus))
    ctx.out.mkdir()
    lm.exp_lm(ctx)
    gradient_paths(ctx)  # reads the runs' checkpoints back
    for name, type in (("gpt", "gpt"), ("lstm", "lstm")):
        out = tmp_path / "out/compare" / f"lm-{name}"
        model = json.loads((out / "config.json").read_text())["config"]["model"]
        assert (model["type"], model["n_embd"], model["block_size"]) == (type, 16, 16)  # the overrides reached it
        assert read_metrics(out, "eval")[-1]["iter"] == 20
    rows = {(r["experiment"], r["measure"].split(" (")[0]): r for r in ctx.rows}
    assert rows["lm", "parameters"]["note"].startswith("corpus corpus.txt")
    vocab = int(rows["lm", "parameters"]["note"].split(", ")[1].split()[0])
    equal_time = rows["lm", "val loss at equal time"]
    assert all(0 < float(equal_time[side]) < math.log(vocab) for side in ("gpt", "lstm"))  # better than uniform
    assert ("paths", "trained: gradient reaching the 16 farthest / the 16 nearest tokens") in rows
    assert {p.name for p in ctx.out.glob("*.png")} == {"lm.png", "gradient_paths.png"}
