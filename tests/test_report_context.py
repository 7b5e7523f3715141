"""scripts/report/context.py, reason (b): the lm and context experiments end to end on tiny models (the lm runs
in process), the truncation, the repeat corpus with its own tuning, the effective context, and each rule (lm,
context) both ways on synthetic numbers."""

import numpy as np
import pytest
import torch
from conftest import compose, words_corpus

from attnlab.record import RunLog
from scripts.report import Context, context, lm
from scripts.report.protocol import Recipe, Tuned
from train import train

LM_TINY = dict(gpt=["model.n_layer=1", "model.n_head=2", "model.n_embd=16"], block_size=16, batch_size=4, steps=8,
               adamw_lrs=dict(gpt=[1e-2], lstm=[3e-2]), muon_lrs=dict(gpt=[0.05], lstm=[0.07]), grid_seeds=1, seeds=2,
               evals=2, eval_iters=1, select_windows=4, test_windows=8, windows=[8])
TINY = dict(windows=8, distances=[4, 8], span=4, context=16, batch_size=4, steps=10,
            adamw_lrs=dict(gpt=[2e-3], lstm=[4e-3]), muon_lrs=dict(gpt=[0.03], lstm=[0.09]), sequences=8)


def test_lm_and_context_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(lm.BUDGET, "quick", LM_TINY)
    monkeypatch.setitem(context.BUDGET, "quick", TINY)
    monkeypatch.setattr(lm, "train_run", lambda overrides: train(compose(*overrides)))  # in-process: seconds
    monkeypatch.setattr(RunLog, "plot", lambda self: None)
    made, make = [], context.make_optimizer
    monkeypatch.setattr(context, "make_optimizer", lambda model, cfg, dev: made.append(cfg) or make(model, cfg, dev))
    ctx = Context("quick", torch.device("cpu"), tmp_path / "report", str(words_corpus(tmp_path / "corpus.txt")))
    ctx.out.mkdir()
    context.exp_lm(ctx)
    context.exp_context(ctx)  # reads the lm runs back
    assert {p.name for p in ctx.out.glob("*.png")} == {"lm.png", "context.png"}
    result = lm.load_lm()

    rows = {r["measure"].split(" (")[0].split(",")[0]: r for r in ctx.rows if r["experiment"] == "lm"}
    vocab = result.vocab
    for measure in ("test loss at equal tokens", "test loss at equal wall time"):
        assert all(0 < float(rows[measure][side].split(" [")[0]) < np.log(vocab) for side in ("gpt", "lstm"))
    best = [r for r in ctx.rows if r["measure"].startswith("test loss at equal tokens") and "best recipe" in
            r["measure"]][0]
    assert "gpt chose" in best["note"] and "muon_lr 0.05 of [0.05]" in best["note"]
    assert any("AdamW for both" in r["measure"] for r in ctx.rows)  # the labelled extra row
    assert f"train.time_budget_s={result.budget_s:g}" in rows["test loss at equal wall time"]["note"]
    verdicts = {v["experiment"]: v for v in ctx.verdicts}
    assert verdicts["lm"]["rule"] == context.LM_RULE and verdicts["context"]["rule"] == context.CONTEXT_RULE

    rows = {r["measure"].split(",")[0].split(" (")[0]: r for r in ctx.rows if r["experiment"] == "context"}
    rise = rows["loss rise at the last position"]
    assert rise["measure"].endswith("k = 1 / 2 / 4 / 8") and len(rise["gpt"].split(" / ")) == 4
    assert f"{result.budget_s:g} s of training" in rise["note"]  # the equal-time models, one budget for both tables
    effective = rows["effective context"]
    assert all(effective[side] in ("<= 1 (the smallest k tried)", "2", "4", "8", "16") for side in ("gpt", "lstm"))
    repeat = rows["loss on a repeated span of 4 random tokens at D = 4 / 8"]
    assert all(0 < float(v) for side in ("gpt", "lstm") for v in repeat[side].split(" / "))
    assert verdicts["context"]["status"] in rows["gap at D = 8"]["note"]
    # the repeat tunes its own recipes from its own grids (seed 0), never the lm experiment's choice
    assert [(c.optimizer, c.learning_rate, c.muon_lr if c.optimizer == "muon" else None) for c in made] == [
        ("adamw", 2e-3, None), ("muon", 2e-3, 0.03), ("adamw", 4e-3, None), ("muon", 4e-3, 0.09)]
    points = [p for p in ctx.grid if p["experiment"] == "context"]
    assert len([p for p in points if p["metric"].startswith("repeated span selection")]) == 4
    assert len([p for p in points if "test loss" in p["metric"]]) == 2 * 2 * 2  # 2 models x 2 D x (repeat, first)
    assert "(c)" in verdicts["context"]["evidence"] or "copies at D = " in verdicts["context"]["evidence"]


def test_truncate_replaces_all_but_the_last_k():
    x = torch.arange(10, 20).repeat(3, 1)  # (3, 10), tokens 10..19
    unigram = torch.zeros(20)
    unigram[:3] = 1 / 3  # draws are 0, 1 or 2: never one of x's tokens
    out = context.truncate(x, 4, unigram, torch.Generator().manual_seed(0))
    assert torch.equal(out[:, -4:], x[:, -4:]) and (out[:, :6] < 3).all()
    assert torch.equal(context.truncate(x, 10, unigram, torch.Generator()), x)  # k = T keeps everything
    assert context.ks_for(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256] and context.ks_for(16) == [1, 2, 4, 8, 16]


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
    assert set(b["adamw_lrs"]) == set(b["muon_lrs"]) == set(lm.NAMES)


def test_training_distances_span_the_test_distances_too_densely_to_learn_each_by_position():
    ds = context.training_distances([32, 128, 512, 768])
    assert ds[0] == 32 and ds[-1] == 768 and ds == sorted(set(ds))
    assert len(ds) > 50  # far more distances than heads to learn them one by one


def test_effective_context_is_where_the_rise_stays_under_a_tenth_of_a_nat():
    ks = [1, 2, 4, 8, 16]
    assert context.effective_context(ks, [0.5, 0.2, 0.05, 0.01]) == 4
    assert context.effective_context(ks, [0.5, 0.05, 0.12, 0.0]) == 8  # from k on, not only at k
    assert context.effective_context(ks, [0.09, 0.05, 0.0, 0.0]) == 1  # a floor: the smallest k tried
    assert context.effective_context(ks, [0.5, 0.4, 0.3, 0.2]) == 16  # still rising at T/2: the whole window
    assert context.context_words(1, ks) == "<= 1 (the smallest k tried)" and context.context_words(4, ks) == "4"


def test_text_outcome_needs_every_seed_apart():
    assert context.text_outcome([64, 128, 64], [4, 8, 8]) == "gpt"
    assert context.text_outcome([4, 8, 64], [8, 8, 8]) is None
    assert context.text_outcome([1, 1, 1], [2, 4, 2]) == "lstm"


@pytest.mark.parametrize("gpt, lstm, copies, outcome", [
    ([(0.2, 0.01), (0.2, 0.01)], [(1.0, 0.02), (3.5, 0.02)], ([4, 8], [4]), "gpt"),  # the LSTM's loss rises with D
    ([(2.0, 0.01), (2.0, 0.01)], [(1.0, 0.02), (1.5, 0.02)], ([4, 8], [4, 8]), "lstm"),  # the LSTM better far off
    ([(1.0, 0.05), (1.0, 0.05)], [(1.0, 0.05), (1.05, 0.05)], ([4, 8], [4, 8]), None),  # alike within the noise
    ([(0.2, 0.01), (3.0, 0.01)], [(1.0, 0.02), (3.5, 0.02)], ([4], [4]), None),  # both rise alike
    # the LSTM never copies, not even at the shortest D: no distance result (its failure is reason (c)'s)
    ([(0.1, 0.02), (0.05, 0.01)], [(3.9, 0.0), (3.9, 0.0)], ([4, 8], []), None),
    ([(3.9, 0.0), (3.9, 0.0)], [(0.1, 0.02), (3.9, 0.01)], ([], [4]), None),  # nor where the GPT never copies
])
def test_the_repeat_counts_only_for_models_that_copy_at_the_shortest_distance(gpt, lstm, copies, outcome):
    assert context.repeat_outcome(gpt, lstm, *copies, [4, 8]) == outcome


@pytest.mark.parametrize("text, repeat, lstm_copies, status", [
    ("gpt", "gpt", True, "shown here"), ("gpt", None, False, "shown here"), ("lstm", None, True, "contradicted here"),
    ("gpt", "lstm", True, "not shown here"), (None, None, True, "not shown here"),
    (None, None, False, "not shown here (the LSTM does not copy even at the shortest D: that is reason (c))"),
])
def test_the_context_verdict_follows_the_tests_that_decide(text, repeat, lstm_copies, status):
    assert context.context_status(text, repeat, lstm_copies) == status


def test_a_copy_is_a_repeat_cheaper_than_the_first_copy_and_a_uniform_guess_beyond_the_noise():
    assert context.copied(dict(first=4.0, repeat=3.0, se=0.1), 3.87)
    assert not context.copied(dict(first=4.0, repeat=3.85, se=0.1), 3.87)
    assert not context.copied(dict(first=3.89, repeat=3.85, se=0.001), 3.87)  # beyond the noise, but too small to count
    assert not context.copied(dict(first=7.3, repeat=3.86, se=0.001), 3.87)  # confidently wrong on the first copy
    assert context.copied(dict(first=7.3, repeat=0.2, se=0.01), 3.87)


def lm_result(gpt, lstm, gpt_time, lstm_time):
    """An LMResult holding what lm_status reads: test losses per seed at equal tokens and at equal time, the recipes
    and the n-gram baselines {n: (k, test loss)}."""
    plan = lm.Plan("data", 16, 4, 8, 2, 1, None, None)
    result = lm.LMResult("quick", "c", 30, 3.0, plan, {}, budget_s=10.0, ngram={2: (1.0, 2.6), 3: (0.1, 2.3)})
    for name, tests, timed in (("gpt", gpt, gpt_time), ("lstm", lstm, lstm_time)):
        recipe = Recipe("muon", 1e-3, 0.04)
        runs = [lm.LMRun("o", recipe, i, 8, 1.0, [], t, t, [], False) for i, t in enumerate(tests)]
        result.tuned[name] = Tuned(recipe, [], False, {r.seed: r for r in runs})
        result.timed[name] = [lm.LMRun("o", recipe, i, 8, 1.0, [], t, t, [], False) for i, t in enumerate(timed)]
    return result


def test_the_lm_verdict_follows_the_numbers_both_ways():
    gpt_wins = context.lm_status(lm_result([2.0, 2.1, 2.05], [2.5, 2.6, 2.55], [1.9, 2.0, 1.95], [2.4, 2.5, 2.45]))
    assert gpt_wins[1] == "shown here" and "gpt lower, the seed ranges apart" in gpt_wins[0]
    assert "seeds 0-2" in gpt_wins[0] and "recipes gpt muon muon_lr 0.04" in gpt_wins[0]
    assert "trigram baseline scores 2.300, beaten on the mean at equal tokens by gpt, equal wall time (10 s) by gpt" \
        in gpt_wins[0]
    lstm_wins = context.lm_status(lm_result([2.5, 2.6, 2.55], [2.0, 2.1, 2.05], [2.4, 2.5, 2.45], [1.9, 2.0, 1.95]))
    assert lstm_wins[1] == "contradicted here" and "lstm lower, the seed ranges apart" in lstm_wins[0]
    # ranges that overlap at equal tokens: not shown, however it goes at equal time
    within = context.lm_status(lm_result([2.0, 2.4, 2.2], [2.3, 2.35, 2.4], [1.9, 2.0, 1.95], [2.4, 2.5, 2.45]))
    assert within[1] == "not shown here" and "the seed ranges overlap" in within[0]
    mixed = context.lm_status(lm_result([2.0, 2.1, 2.05], [2.5, 2.6, 2.55], [2.4, 2.5, 2.45], [1.9, 2.0, 1.95]))
    assert mixed[1] == "not shown here"
