"""scripts/report/context.py, reason (b)'s context use: with the lm experiment, end to end on tiny models (the runs
in process); the truncation, the repeat corpus with its own tuning, the effective context, and the rule both ways on
synthetic numbers."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import compose, words_corpus

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from attnlab.record import RunLog
from scripts.report import Context, context, lm, sizes, tasks
from train import train

ADAMW, MUON = (("gpt", (1e-2,)), ("lstm", (3e-2,))), (("gpt", (0.05,)), ("lstm", (0.07,)))
LM_TINY = lm.Budget(gpt=("model.n_layer=1", "model.n_head=2", "model.n_embd=16"), block_size=16, batch_size=4,
                    steps=8, adamw_lrs=ADAMW, muon_lrs=MUON, seeds=2, evals=2, eval_iters=1, select_windows=4,
                    test_windows=8)
SIZES_TINY = sizes.Budget(gpt=((1, 2, 16), (1, 2, 24)), block_size=16, batch_size=4, muon_lrs=MUON, adamw_lrs=ADAMW,
                          widen=0, seeds=3, evals=2, eval_iters=1, select_windows=4, test_windows=8, train_windows=4)
TINY = context.Budget(windows=8, distances=(4, 8), span=4, context=16, batch_size=4, steps=10,
                      adamw_lrs=(("gpt", (2e-3,)), ("lstm", (4e-3,))), muon_lrs=(("gpt", (0.03,)), ("lstm", (0.09,))),
                      sequences=8)


def test_lm_and_context_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(lm.BUDGET, "quick", LM_TINY)
    monkeypatch.setitem(sizes.BUDGET, "quick", SIZES_TINY)
    monkeypatch.setitem(context.BUDGET, "quick", TINY)
    monkeypatch.setattr(sizes, "TOKENS_PER_PARAM", 0.05)
    monkeypatch.setattr(lm, "run_train_py", lambda overrides: train(compose(*overrides)))  # in-process: seconds
    monkeypatch.setattr(RunLog, "plot", lambda self: None)
    made, make = [], tasks.make_optimizer
    monkeypatch.setattr(tasks, "make_optimizer", lambda model, cfg, dev: made.append(cfg) or make(model, cfg, dev))
    ctx = Context("quick", torch.device("cpu"), tmp_path / "report", str(words_corpus(tmp_path / "corpus.txt")))
    ctx.out.mkdir()
    lm.exp_lm(ctx)
    sizes.train_sizes(ctx)
    context.exp_context(ctx)  # reads the sizes runs back
    assert {p.name for p in ctx.out.glob("*.png")} == {"lm.png", "context.png"}
    result = lm.cached_lm(ctx)

    rows = {r["measure"].split(" (")[0].split(",")[0]: r for r in ctx.rows if r["experiment"] == "lm"}
    vocab = result.vocab
    for measure in ("test loss at equal tokens", "test loss at equal wall time"):
        assert all(0 < float(rows[measure][side].split(" [")[0]) < np.log(vocab) for side in ("gpt", "lstm"))
    best = [r for r in ctx.rows if r["measure"].startswith("test loss at equal tokens") and "best recipe" in
            r["measure"]][0]
    assert "decides nothing" in best["measure"] and "tokens per parameter" in best["measure"]
    assert "gpt chose" in best["note"] and "muon_lr 0.05 of [0.05]" in best["note"]
    assert any("AdamW for both" in r["measure"] for r in ctx.rows)  # the labelled extra row
    assert f"train.time_budget_s={result.budget_s:g}" in rows["test loss at equal wall time"]["note"]
    assert "not evidence for (b)" in rows["test loss at equal wall time"]["measure"]
    verdicts = {v["experiment"]: v for v in ctx.verdicts}
    assert "lm" not in verdicts and verdicts["context"]["rule"] == context.RULE  # lm decides nothing

    rows = {r["measure"].split(",")[0].split(" (")[0]: r for r in ctx.rows if r["experiment"] == "context"}
    rise = rows["loss rise at the last position"]
    assert rise["measure"].endswith("k = 1 / 2 / 4 / 8") and len(rise["gpt"].split(" / ")) == 4
    assert "1x24" in rise["note"]  # the largest sizes pair
    effective = rows["effective context per seed"]
    assert all(len(effective[side].split(", ")) == 3 for side in ("gpt", "lstm"))  # one per seed of the sizes runs
    assert all(k in ("1", "2", "4", "8", "16") for side in ("gpt", "lstm") for k in effective[side].split(", "))
    assert rows["test loss at positions 1-8 / 9-16"]["gpt"].count("[") == 2
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


def test_cutting_the_window_keeps_only_the_last_k_tokens():
    """The loss with the last k tokens kept is the model's loss on that suffix alone: nothing is put in the cut
    part's place."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=12, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    tokens = np.random.default_rng(0).integers(0, 12, 400)
    losses = context.last_position_losses(model, tokens, 16, [2, 16], windows=5)
    starts = np.linspace(0, len(tokens) - 17, 5).astype(int)
    for i, s in enumerate(starts):
        x = torch.from_numpy(tokens[s + 14:s + 16].astype(np.int64))[None]  # the last 2 of the window
        logits = model(x)[0][0, -1]
        assert torch.isclose(losses[2][i], F.cross_entropy(logits, torch.tensor(int(tokens[s + 16]))), atol=1e-5)


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
    assert b.span <= min(b.distances)  # the two copies never overlap, so every copyable token is a copy
    assert max(b.distances) + b.span <= b.context + 1  # the pair fits the window at the largest D
    assert set(dict(b.adamw_lrs)) == set(dict(b.muon_lrs)) == set(lm.NAMES)


def test_training_distances_span_the_test_distances_too_densely_to_learn_each_by_position():
    ds = context.training_distances([32, 128, 512, 768])
    assert ds[0] == 32 and ds[-1] == 768 and ds == sorted(set(ds))
    assert len(ds) > 50  # far more distances than heads to learn them one by one


def test_effective_context_is_where_the_rise_stays_within_the_material_difference_and_the_noise():
    ks = [1, 2, 4, 8, 16]
    def rise(*means, se=0.001):
        return [(m, se) for m in means]
    assert context.effective_context(ks, rise(0.5, 0.2, 0.015, 0.01)) == 4
    assert context.effective_context(ks, rise(0.5, 0.015, 0.03, 0.0)) == 8  # from k on, not only at k
    assert context.effective_context(ks, rise(0.019, 0.015, 0.0, 0.0)) == 1  # a floor: the smallest k tried
    assert context.effective_context(ks, rise(0.5, 0.4, 0.3, 0.2)) == 16  # still rising at T/2: the whole window
    assert context.effective_context(ks, rise(0.5, 0.2, 0.03, 0.03, se=0.02)) == 4  # within 2 standard errors


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
