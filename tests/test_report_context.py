"""scripts/report/context.py: the experiment end to end on tiny models (the lm experiment's runs made first, in
process), the truncation, the repeat corpus, the effective context and the verdict's rule both ways."""

import numpy as np
import pytest
import torch
from conftest import compose, words_corpus

from attnlab.record import RunLog
from scripts.report import Context, context, lm
from train import train

LM_TINY = dict(gpt=["model.n_layer=1", "model.n_head=2", "model.n_embd=16"], block_size=16, batch_size=4, steps=8,
               lrs=dict(gpt=[1e-2], lstm=[3e-2]), muon_lrs=dict(gpt=[0.05], lstm=[0.07]), grid_seeds=1, seeds=2,
               evals=2, eval_iters=1, select_windows=4,
               test_windows=8, windows=[8])
TINY = dict(windows=8, distances=[4, 8], span=4, context=16, batch_size=4, steps=10, test_sequences=8)


def test_context_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(lm.BUDGET, "quick", LM_TINY)
    monkeypatch.setitem(context.BUDGET, "quick", TINY)
    monkeypatch.setattr(lm, "train_run", lambda overrides: train(compose(*overrides)))  # in-process: seconds
    monkeypatch.setattr(RunLog, "plot", lambda self: None)
    made, make = [], context.make_optimizer
    monkeypatch.setattr(context, "make_optimizer", lambda model, cfg, dev: made.append(cfg) or make(model, cfg, dev))
    ctx = Context("quick", torch.device("cpu"), tmp_path / "report", str(words_corpus(tmp_path / "corpus.txt")))
    ctx.out.mkdir()
    context.exp_context(ctx)  # finds no lm runs and makes them first
    assert (ctx.out / "context.png").exists()
    rows = {r["measure"].split(",")[0]: r for r in ctx.rows if r["experiment"] == "context"}
    rise = rows["loss rise at the last position"]
    assert len(rise["gpt"].split(" / ")) == 1 and rise["measure"].endswith("k = 8")  # k = 8 of a context of 16
    assert {rows["effective context (k from which on the rise is within the seeds' min-max range)"][side]
            for side in ("gpt", "lstm")} <= {"8", "16"}
    repeat = rows["loss on a repeated span of 4 random tokens at D = 4 / 8"]
    assert all(0 < float(v) for side in ("gpt", "lstm") for v in repeat[side].split(" / "))
    [verdict] = [v for v in ctx.verdicts if v["experiment"] == "context"]  # the lm runs it made give their own
    assert verdict["experiment"] == "context" and verdict["status"] in rows["gap at D = 8"]["note"]
    points = [p for p in ctx.grid if p["experiment"] == "context"]
    assert len(points) == 2 * 2 * 2  # 2 models x 2 distances x (repeat, first copy)
    summary = lm.lm_summary()
    assert len(made) == 2  # the repeat runs train with each model's equal-time recipe, the GPT's with Muon
    for cfg, name in zip(made, ("gpt", "lstm")):
        recipe = summary["best_time"][name]
        assert (cfg.optimizer, cfg.learning_rate) == (lm.RECIPES[recipe][1], summary[name]["lr"])
        assert cfg.optimizer == "adamw" or cfg.muon_lr == summary["equal_time"][recipe]["lr"]
    assert made[0].optimizer == "muon" and made[0].muon_lr == 0.05
    settings = {p["setting"].split(" adamw_lr")[0] for p in points if p["model"] == "gpt"}
    assert settings == {"repeat D=4 span=4 context=16 muon", "repeat D=8 span=4 context=16 muon"}


def test_truncate_replaces_all_but_the_last_k():
    x = torch.arange(10, 20).repeat(3, 1)  # (3, 10), tokens 10..19
    unigram = torch.zeros(20)
    unigram[:3] = 1 / 3  # draws are 0, 1 or 2: never one of x's tokens
    out = context.truncate(x, 4, unigram, torch.Generator().manual_seed(0))
    assert torch.equal(out[:, -4:], x[:, -4:]) and (out[:, :6] < 3).all()
    assert torch.equal(context.truncate(x, 10, unigram, torch.Generator()), x)  # k = T keeps everything
    assert context.ks_for(256) == [8, 16, 32, 64, 128, 256]


def test_the_span_repeats_at_distance_d():
    tokens = np.arange(1000).astype(np.uint16) % 50 + 50  # text tokens 50..99; the span's are drawn from 0..49
    x, y, d, at = context.repeat_batch(tokens, 64, [5, 9, 20], 4, 24, torch.arange(50),
                                       torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (64, 24) and set(d.tolist()) == {5, 9, 20}
    assert len(set(at.tolist())) > 5  # the pair sits at many places
    s = torch.cat([x, y[:, -1:]], 1)  # the window, (B, 25)
    assert torch.equal(y[:, :-1], x[:, 1:])  # targets are the next tokens
    for row, D, a in zip(s, d.tolist(), at.tolist()):
        assert a - D >= 0 and a + 4 <= 25
        span = row[a:a + 4]
        assert torch.equal(row[a - D:a - D + 4], span) and (span < 50).all()  # the span again, D earlier
        assert (row < 50).sum() == 8  # text everywhere else
    kept = context.copyable(y, at, 4)
    assert ((kept >= 0).sum(1) == 3).all()
    assert all(torch.equal(k[a:a + 3], s[i, a + 1:a + 4]) for i, (k, a) in enumerate(zip(kept, at.tolist())))


@pytest.mark.parametrize("preset", sorted(context.BUDGET))
def test_every_presets_repeat_corpus_fits_its_window(preset):
    b = context.BUDGET[preset]
    assert b["span"] <= min(b["distances"])  # the two copies never overlap, so every copyable token is a copy
    assert max(b["distances"]) + b["span"] <= b["context"] + 1  # the pair fits the window at the largest D


def test_training_distances_span_the_test_distances_too_densely_to_learn_each_by_position():
    ds = context.training_distances([32, 128, 512, 768])
    assert ds[0] == 32 and ds[-1] == 768 and ds == sorted(set(ds))
    assert len(ds) > 50  # far more distances than heads to learn them one by one


def test_effective_context_is_where_the_rise_drops_within_the_seeds_range():
    ks = [8, 16, 32, 64]
    rises = torch.tensor([[0.5, 0.10, 0.01, 0.0], [0.6, 0.12, 0.05, 0.0]])  # at 32: mean 0.03, range 0.04
    assert context.effective_context(ks, rises) == 32
    assert context.effective_context(ks, torch.tensor([[0.5, 0.2, 0.1, 0.0]])) == 64  # one seed: any rise counts


@pytest.mark.parametrize("gpt, lstm, copies, status", [
    ([(0.2, 0.01), (0.2, 0.01)], [(1.0, 0.02), (3.5, 0.02)], (2, 1), "shown here"),  # the LSTM's loss rises with D
    ([(0.1, 0.02), (0.05, 0.01)], [(3.9, 0.0), (3.9, 0.0)], (2, 0), "shown here"),  # the LSTM copies at no D
    ([(2.0, 0.01), (2.0, 0.01)], [(1.0, 0.02), (1.5, 0.02)], (2, 2), "contradicted here"),  # the LSTM better far off
    ([(1.0, 0.05), (1.0, 0.05)], [(1.0, 0.05), (1.05, 0.05)], (2, 2), "not shown here"),  # alike within the noise
    ([(0.2, 0.01), (3.0, 0.01)], [(1.0, 0.02), (3.5, 0.02)], (1, 1), "not shown here"),  # both rise alike
    ([(3.86, 0.001), (3.85, 0.001)], [(3.87, 0.001), (3.87, 0.001)], (0, 0), "not shown here"),  # beyond noise, tiny
    ([(3.86, 0.001), (3.95, 0.001)], [(3.87, 0.001), (3.87, 0.001)], (0, 0), "not shown here"),  # LSTM better, tiny
])
def test_verdict_from_the_repeat_loss_by_distance(gpt, lstm, copies, status):
    assert context.decide(gpt, lstm, *copies) == status


def test_a_copy_is_a_repeat_cheaper_than_the_first_copy_and_a_uniform_guess_beyond_the_noise():
    assert context.copied(dict(first=4.0, repeat=3.0, se=0.1), 3.87)
    assert not context.copied(dict(first=4.0, repeat=3.85, se=0.1), 3.87)
    assert not context.copied(dict(first=3.89, repeat=3.85, se=0.001), 3.87)  # beyond the noise, but too small to count
    assert not context.copied(dict(first=7.3, repeat=3.86, se=0.001), 3.87)  # confidently wrong on the first copy
    assert context.copied(dict(first=7.3, repeat=0.2, se=0.01), 3.87)
