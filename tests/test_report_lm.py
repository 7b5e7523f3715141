"""scripts/report/lm.py: the language-model experiments end to end on tiny models (train.py trains them, their
checkpoints are scored, rows, grid points, a verdict and figures are written), and the measures they report: the
loss at each position and whether it changes above the seed spread, the n-gram baselines against a hand count, the
verdict both ways, equal-time runs through train.time_budget_s, and a model run at twice its training length."""
import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import compose, words_corpus

from attnlab.checkpoint import build_model, save_checkpoint
from attnlab.config import ModelConfig
from attnlab.record import RunLog, read_metrics
from scripts.report import Context, lm
from scripts.report.mechanism import gradient_paths
from train import train

TINY = dict(gpt=["model.n_layer=1", "model.n_head=2", "model.n_embd=16"], block_size=16, batch_size=4, steps=8,
            lrs=dict(gpt=[1e-3, 1e-2, 3e-2], lstm=[3e-3, 3e-2]), muon_lrs=dict(gpt=[0.01, 0.02], lstm=[0.01, 0.02]),
            grid_seeds=1, seeds=3, evals=4, eval_iters=2,
            select_windows=None, test_windows=None, windows=[8])


@pytest.fixture
def tiny_report(tmp_path, monkeypatch):
    """A Context on a words corpus, in tmp_path (the runs, out/compare, and data/prepared are relative paths), with
    the quick preset shrunk to TINY."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(lm.BUDGET, "quick", TINY)
    ctx = Context("quick", torch.device("cpu"), tmp_path / "report", str(words_corpus(tmp_path / "corpus.txt")))
    ctx.out.mkdir()
    return ctx


def rows_of(ctx, experiment):
    return {r["measure"].split(":")[0].split(" (")[0]: r for r in ctx.rows if r["experiment"] == experiment}


def mean(cell):
    return float(cell.split(" [")[0])


@pytest.mark.slow
def test_lm_trains_both_models_with_train_py(tiny_report, monkeypatch):
    ctx = tiny_report
    monkeypatch.setitem(lm.BUDGET, "quick", {**TINY, "lrs": dict(gpt=[1e-2], lstm=[3e-2]),
                                             "muon_lrs": dict(gpt=[0.02], lstm=[0.02]), "seeds": 1})
    lm.exp_lm(ctx)
    gradient_paths(ctx)  # reads the best runs' checkpoints back
    for name, type in (("gpt", "gpt"), ("lstm", "lstm")):
        out = lm.best_run(name)
        receipt = json.loads((out / "config.json").read_text())
        model = receipt["config"]["model"]
        assert receipt["argv"][0].endswith("train.py")  # a train.py process made it
        assert (model["type"], model["block_size"]) == (type, 16)  # the overrides reached it
        assert read_metrics(out, "eval")[-1]["iter"] == 8
    summary = lm.lm_summary()
    assert summary["corpus"] == "corpus.txt"
    for recipe, (name, optimizer) in lm.RECIPES.items():  # each equal-time run was a train.py run on a time budget
        train = json.loads((Path(summary["equal_time"][recipe]["runs"][0]["out"]) / "config.json").read_text())
        assert (train["config"]["train"]["optimizer"], train["config"]["train"]["time_budget_s"]) == (
            optimizer, summary["budget_s"])
    assert {p.name for p in ctx.out.glob("*.png")} == {"lm.png", "gradient_paths.png"}
    assert any(r["experiment"] == "paths" and r["measure"].startswith("trained: gradient") for r in ctx.rows)


@pytest.mark.slow
def test_lm_positions_and_window_end_to_end(tiny_report, monkeypatch):
    """positions finds no lm runs and trains them first; window then reuses them. train.py's train runs in this
    process (the test above spawns train.py itself) and skips its loss.png, to keep 15 runs short."""
    ctx = tiny_report
    monkeypatch.setattr(lm, "train_run", lambda overrides: train(compose(*overrides)))
    monkeypatch.setattr(RunLog, "plot", lambda self: None)
    lm.exp_positions(ctx)
    lm_rows = len(rows_of(ctx, "lm"))
    lm.exp_window(ctx)
    assert len(rows_of(ctx, "lm")) == lm_rows and len(ctx.rows) > lm_rows  # window reused the lm runs
    summary = lm.lm_summary()
    assert summary["corpus"] == "corpus.txt" and all(summary[n]["data_dir"] for n in ("gpt", "lstm"))

    grid = [p for p in ctx.grid if p["experiment"] == "lm" and p["setting"] == "context=16"]  # equal tokens
    for name in ("gpt", "lstm"):
        chosen = summary[name]["lr"]
        selection = {p["lr"]: p["value"] for p in grid if p["model"] == name and p["metric"] == "selection loss"
                     and p["seed"] == 0}
        assert set(TINY["lrs"][name]) <= set(selection)  # every grid point is in the grid table (widened or not)
        assert sorted(selection) == [lr for lr, _ in summary[name]["grid"]]  # the rows name the grid tried
        assert chosen == min(selection, key=selection.get)  # the lowest selection loss, not the test loss
        assert chosen not in (min(selection), max(selection)) or summary[name]["edge"]
        assert {p["seed"] for p in grid if p["model"] == name and p["lr"] == chosen} == {0, 1, 2}
        assert lm.best_run(name) == lm.RUNS / "lm" / f"{name}-context16-lr{chosen:g}-seed0"
    capped = [p for p in ctx.grid if "time=" not in p["setting"]]
    assert {p["steps"] for p in capped} == {TINY["steps"]}  # every equal-token run, of both models, to the same cap
    timed = [p for p in ctx.grid if "time=" in p["setting"]]
    assert {p["setting"].split()[1] for p in timed} == {"adamw", "muon"} and all(p["steps"] > 0 for p in timed)
    for recipe, (name, _) in lm.RECIPES.items():  # every recipe, at its chosen lr, with every seed
        assert [r["seed"] for r in summary["equal_time"][recipe]["runs"]] == [0, 1, 2]
    assert summary["best_time"]["gpt"] == "gpt muon" and summary["best_time"]["lstm"] in ("lstm adamw", "lstm muon")
    batch = {json.loads((d / "config.json").read_text())["config"]["train"]["batch_size"]
             for d in (lm.RUNS / "lm").iterdir() if d.is_dir()}
    assert batch == {TINY["batch_size"]}
    assert {p["setting"] for p in ctx.grid if p["experiment"] == "positions"} == {"pos=learned", "pos=sinusoidal",
                                                                                   "pos=none"}
    assert {p["setting"] for p in ctx.grid if p["experiment"] == "window"} == {"window=8"}

    rows, vocab = rows_of(ctx, "lm"), summary["vocab"]
    assert 0 < summary["unigram"] < math.log(vocab) and f"{summary['unigram']:.2f} nats" in rows["models"]["note"]
    test = rows["test loss at equal tokens"]
    assert all(0 < mean(test[side]) < math.log(vocab) for side in ("gpt", "lstm"))  # better than uniform
    assert "tried" in test["note"] and "still improving" in test["note"] and "seeds 0-2" in test["note"]
    assert "bigram" in test["note"] and "trigram" in test["note"]
    timed_row = rows["test loss at equal wall time"]
    assert f"train.time_budget_s={summary['budget_s']:g}" in timed_row["note"] and "(chosen)" in timed_row["note"]
    assert all(0 < mean(timed_row[side]) < math.log(vocab) for side in ("gpt", "lstm"))
    assert any(m.startswith("tokens seen in") for m in rows)
    positions_row = rows["test loss at positions 1-8 / 9-16"]
    assert len(positions_row["gpt"].split(" / ")) == 2 and "detectable" in positions_row["note"]
    assert "too short" in rows["loss change past position 128"]["note"]
    [verdict] = ctx.verdicts
    assert (verdict["experiment"], verdict["reason"]) == ("lm", "b") and "equal wall time" in verdict["evidence"]
    positions = rows_of(ctx, "positions")
    assert len(positions["test loss at the trained length 16"]["gpt"].split(" / ")) == 4
    long = positions["test loss at positions 17-32, run at 32"]
    assert len(long["gpt"].split(" / ")) == 3 and "learned" in long["note"]
    assert all(math.isfinite(mean(cell)) for cell in [*long["gpt"].split(" / "), long["lstm"]])
    window = rows_of(ctx, "window")
    assert len(window["test loss at context 16"]["gpt"].split(" / ")) == 2
    assert "reaches 7 tokens back" in window["loss a window costs against full attention"]["note"]
    assert {p.name for p in ctx.out.glob("*.png")} == {"lm.png", "positions.png", "window.png"}


@pytest.mark.parametrize("pos", ["rope", "sinusoidal", "none"])
def test_a_model_run_at_twice_its_length_predicts_the_first_half_alike(tmp_path, pos):
    cfg = ModelConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=16, pos=pos)
    torch.manual_seed(0)
    model = build_model(cfg)
    save_checkpoint(tmp_path / "ckpt.pt", {"model": model.state_dict(), "model_config": asdict(cfg), "meta": {}})
    long = lm.final_model(tmp_path, block_size=16)
    x = torch.randint(20, (2, 16))
    assert long.config.block_size == 16 and long(x)[0].shape == (2, 16, 20)
    torch.testing.assert_close(long(x[:, :8])[0], model.eval()(x[:, :8])[0])


def test_learned_positions_cannot_run_past_their_table(tmp_path):
    cfg = ModelConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16, pos="learned")
    save_checkpoint(tmp_path / "ckpt.pt", {"model": build_model(cfg).state_dict(), "model_config": asdict(cfg),
                                           "meta": {}})
    with pytest.raises(RuntimeError, match="wpe"):
        lm.final_model(tmp_path, block_size=16)


def test_position_losses_average_the_cross_entropy_of_every_window():
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16)).eval()
    tokens = np.random.default_rng(0).integers(0, 20, 8 * 10 + 5).astype(np.uint16)
    losses = lm.position_losses(model, tokens, 8, batch_size=3)  # 10 windows, in batches that do not divide them
    windows = torch.from_numpy(tokens[:81].astype(np.int64))
    x, y = windows[:-1].view(10, 8), windows[1:].view(10, 8)  # non-overlapping: window k starts at 8k
    expected = F.cross_entropy(model(x)[0].transpose(1, 2), y, reduction="none").mean(0)
    torch.testing.assert_close(losses, expected)
    assert lm.position_losses(model, tokens, 8, windows=2).shape == (8,)


def test_half_octave_bins_average_the_positions_they_cover():
    p = torch.arange(1, 257).float()
    starts, means = lm.half_octaves(torch.stack([p, 2 * p]))
    assert starts == [1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128, 181]
    assert means[:, -1].tolist() == [218.5, 437.0] and means[:, 3].tolist() == [4.5, 9.0]  # 181-256 and 4-5
    assert lm.position_bins(256) == [(1, 8), (9, 64), (65, 256)] and lm.position_bins(16) == [(1, 8), (9, 16)]


def seeds_of(curve, offsets=(0.0, 0.05, 0.1)):
    """Three seeds of one loss curve (T,), each shifted by its offset: a seed spread of 0.1 in every bin."""
    return torch.stack([curve + o for o in offsets])


def test_a_change_by_position_counts_only_above_the_seed_spread():
    p = torch.arange(1, 257).float()
    falls_to_8 = seeds_of(torch.where(p <= 8, 3 - p / 8, 2.0))  # 1 nat over the first 8 positions, then flat
    delta, noise = lm.change(falls_to_8, (1, 8), (9, 64))
    assert delta == pytest.approx(-(1 - 4.5 / 8)) and noise == pytest.approx(0.1, abs=1e-5)
    assert lm.change(falls_to_8, (9, 64), (65, 256))[0] == pytest.approx(0.0, abs=1e-6)
    note = lm.position_note(falls_to_8, lm.position_bins(256))
    assert "no gain past position 64 detectable above the seed spread" in note and "rises" not in note
    still = lm.position_note(seeds_of(3 - p / 256), lm.position_bins(256))  # 0.6 nats from 9-64 to 65-256
    assert "still falls past position 64 above the seed spread" in still
    small = seeds_of(3 - p / 256, offsets=(0.0, 0.5, 1.0))  # the same fall inside a seed spread of 1 nat
    assert "no gain past position 8 detectable" in lm.position_note(small, lm.position_bins(256))
    rising = seeds_of(torch.where(p <= 8, 3.0, 3 + p / 64))  # the loss rises past position 8
    assert "rises at 9-64, 65-256 above the spread" in lm.position_note(rising, lm.position_bins(256))


def test_kaplan_finding_is_read_off_both_curves_against_the_seed_spread():
    p = torch.arange(1, 257).float()
    flat_after_100, still_falling = seeds_of(torch.where(p <= 100, 3 - p / 100, 2.0)), seeds_of(3 - p / 256)
    holds = lm.kaplan_note({"gpt": still_falling, "lstm": flat_after_100}, 256)
    assert holds.startswith("as Kaplan et al. 2020 (fig. 7) found") and "gpt -0.375 (seed spread 0.100)" in holds
    assert lm.kaplan_note({"gpt": flat_after_100, "lstm": flat_after_100}, 256).startswith("neither model gains")
    assert lm.kaplan_note({"gpt": still_falling, "lstm": still_falling}, 256).startswith("unlike Kaplan")
    assert lm.kaplan_note({"gpt": flat_after_100, "lstm": still_falling}, 256).startswith("the opposite")
    assert "too short" in lm.kaplan_note({"gpt": still_falling[:, :128], "lstm": still_falling[:, :128]}, 128)


def test_ngram_losses_match_a_hand_count():
    train, vocab = np.array([0, 1, 0, 1, 2]), 3
    # bigrams in train: 01 twice, 10 once, 12 once; contexts followed by a token: 0 twice, 1 twice
    joint, context = lm.ngram_counts(train, np.array([0, 1, 2]), 2, vocab)  # scored: 01, 12
    assert joint.tolist() == [2, 1] and context.tolist() == [2, 2]
    assert lm.ngram_loss(joint, context, vocab, 1.0) == pytest.approx(-(math.log(3 / 5) + math.log(2 / 5)) / 2)
    # trigrams in train: 010, 101, 012; contexts 01 twice, 10 once; scored: 012 (seen), 120 (context 12 unseen)
    joint, context = lm.ngram_counts(train, np.array([0, 1, 2, 0]), 3, vocab)
    assert joint.tolist() == [1, 0] and context.tolist() == [2, 0]
    k = 0.1
    assert lm.ngram_loss(joint, context, vocab, k) == pytest.approx(-(math.log(1.1 / 2.3) + math.log(1 / 3)) / 2)


def test_ngram_baselines_choose_k_on_the_selection_half_and_score_the_test_half(monkeypatch):
    cycle = np.tile([0, 1, 2, 3], 500)  # each token fixes the next: a bigram model predicts it almost surely
    val = np.concatenate([np.tile([0, 1, 2, 3], 50), np.tile([0, 2, 1, 3], 50)])  # the test half breaks the cycle
    monkeypatch.setattr(lm, "load_split", lambda data_dir, split: cycle if split == "train" else val)
    result = lm.ngram_baselines("unused", 4)
    assert result[2][0] == min(lm.ADD_K)  # the selection half follows the cycle: the least smoothing wins
    assert result[2][1] > 5  # scored on the test half, whose bigrams train never held
    test_half = val[len(val) // 2:]
    assert result[2][1] == pytest.approx(lm.ngram_loss(*lm.ngram_counts(cycle, test_half, 2, 4), 4, min(lm.ADD_K)))


def fake_summary(gpt, lstm, gpt_time, lstm_time):
    """A summary holding only what lm_verdict reads: test losses per seed at equal tokens and at equal time, and the
    n-gram baselines {n: (k, test loss)}."""
    def runs(tests):
        return [dict(seed=i, test=t) for i, t in enumerate(tests)]
    return dict(gpt=dict(runs=runs(gpt)), lstm=dict(runs=runs(lstm)), budget_s=10.0,
                ngram={2: (1.0, 2.6), 3: (0.1, 2.3)}, best_time=dict(gpt="gpt muon", lstm="lstm adamw"),
                equal_time={"gpt muon": dict(runs=runs(gpt_time)), "lstm adamw": dict(runs=runs(lstm_time))})


def test_the_verdict_follows_the_numbers_both_ways():
    gpt_wins = lm.lm_verdict(fake_summary([2.0, 2.1, 2.05], [2.5, 2.6, 2.55], [1.9, 2.0, 1.95], [2.4, 2.5, 2.45]))
    assert gpt_wins[1] == "shown here" and "gpt lower by more than the seed spread" in gpt_wins[0]
    assert "seeds 0-2" in gpt_wins[0]
    assert "trigram baseline scores 2.300, beaten on the mean at equal tokens by gpt, equal wall time (10 s) by gpt" \
        in gpt_wins[0]
    neither = lm.lm_verdict(fake_summary([2.5, 2.6, 2.55], [2.4, 2.5, 2.45], [2.4, 2.5, 2.45], [2.5, 2.6, 2.55]))
    assert "at equal tokens by neither" in neither[0]  # both above the trigram's 2.3
    lstm_wins = lm.lm_verdict(fake_summary([2.5, 2.6, 2.55], [2.0, 2.1, 2.05], [2.4, 2.5, 2.45], [1.9, 2.0, 1.95]))
    assert lstm_wins[1] == "contradicted here" and "lstm lower by more than" in lstm_wins[0]
    # the GPT ahead at equal tokens by less than its seeds' spread of 0.4: not shown, however it does at equal time
    within = lm.lm_verdict(fake_summary([2.0, 2.4, 2.2], [2.3, 2.35, 2.4], [1.9, 2.0, 1.95], [2.4, 2.5, 2.45]))
    assert within[1] == "not shown here" and "within the seed spread" in within[0]
    mixed = lm.lm_verdict(fake_summary([2.0, 2.1, 2.05], [2.5, 2.6, 2.55], [2.4, 2.5, 2.45], [1.9, 2.0, 1.95]))
    assert mixed[1] == "not shown here"


def test_equal_time_runs_train_through_train_py_time_budget(tiny_report, monkeypatch):
    """The Muon recipe's grid at equal time: every run gets train.time_budget_s and a step cap far past it, and the
    seconds, not the cap, end it; the chosen muon_lr is trained with every seed."""
    ctx, calls = tiny_report, []
    def train_in_process(overrides):
        calls.append(overrides)
        train(compose(*overrides))
    monkeypatch.setattr(lm, "train_run", train_in_process)
    monkeypatch.setattr(RunLog, "plot", lambda self: None)
    summary = lm.setup(ctx)
    summary["lstm"]["lr"] = 3e-3  # as if tuned at equal tokens
    result = lm.tune(ctx, summary, "lstm", "muon", seconds=0.3)
    cap = lm.MAX_ITERS_PER_CAP * TINY["steps"]
    for overrides in calls:
        assert {"train.time_budget_s=0.3", "train.optimizer=muon", f"train.max_iters={cap}",
                "train.learning_rate=0.003"} <= set(overrides)
    assert {o for c in calls for o in c if o.startswith("train.muon_lr=")} >= {"train.muon_lr=0.01",
                                                                              "train.muon_lr=0.02"}
    assert [r["seed"] for r in result["runs"]] == [0, 1, 2] and result["lr"] in [lr for lr, _ in result["grid"]]
    for r in result["runs"]:
        assert 0 < r["iters"] < cap and r["seconds"] >= 0.3  # the budget, not the cap, ended it
        assert json.loads((Path(r["out"]) / "config.json").read_text())["config"]["train"]["time_budget_s"] == 0.3
    timed = [p for p in ctx.grid if p["setting"] == "context=16 muon time=0.3s adamw_lr=0.003"]
    assert len(timed) == 2 * len(calls)  # a selection and a test loss per run
