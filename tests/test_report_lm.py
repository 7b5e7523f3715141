"""scripts/report/lm.py: the language-model runs end to end on tiny models (train.py trains them, their checkpoints
are scored, grid points written), the typed result the other experiments read back, and the measures: the loss at
each position and whether it changes above the seed spread, the n-gram baselines against a hand count, equal-time runs
through train.time_budget_s, and a model run at twice its training length."""
import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import compose, words_corpus

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from attnlab.record import RunLog, read_metrics
from scripts.report import Context, lm
from scripts.report.mechanism import gradient_paths
from scripts.report.protocol import Recipe, Tuned
from train import train

TINY = lm.Budget(gpt=("model.n_layer=1", "model.n_head=2", "model.n_embd=16"), block_size=16, batch_size=4, steps=8,
                 adamw_lrs=(("gpt", (1e-3, 1e-2, 3e-2)), ("lstm", (3e-3, 3e-2))),
                 muon_lrs=(("gpt", (0.01, 0.02)), ("lstm", (0.01, 0.02))), seeds=3, evals=4, eval_iters=2,
                 select_windows=None, test_windows=None)


@pytest.fixture
def tiny_report(tmp_path, monkeypatch):
    """A Context on a words corpus, in tmp_path (the runs, out/report, and data/prepared are relative paths), with
    the quick preset shrunk to TINY."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(lm.BUDGET, "quick", TINY)
    ctx = Context("quick", torch.device("cpu"), tmp_path / "report", str(words_corpus(tmp_path / "corpus.txt")))
    ctx.out.mkdir()
    return ctx


def in_process(monkeypatch):
    """train.py's train in this process, without its loss.png: seconds instead of a start-up per run."""
    monkeypatch.setattr(lm, "run_train_py", lambda overrides: train(compose(*overrides)))
    monkeypatch.setattr(RunLog, "plot", lambda self: None)


def rows_of(ctx, experiment):
    return {r["measure"].split(":")[0].split(" (")[0]: r for r in ctx.rows if r["experiment"] == experiment}


def mean(cell):
    return float(cell.split(" [")[0])


@pytest.mark.slow
def test_lm_trains_both_models_with_train_py(tiny_report, monkeypatch):
    ctx = tiny_report
    monkeypatch.setitem(lm.BUDGET, "quick", replace(TINY, adamw_lrs=(("gpt", (1e-2,)), ("lstm", (3e-2,))),
                                                    muon_lrs=(("gpt", (0.02,)), ("lstm", (0.02,))), seeds=1))
    lm.exp_lm(ctx)
    gradient_paths(ctx)  # reads the best runs' checkpoints back
    for name, type in (("gpt", "gpt"), ("lstm", "lstm")):
        out = lm.best_run(ctx, name)
        receipt = json.loads((out / "config.json").read_text())
        model = receipt["config"]["model"]
        assert receipt["argv"][0].endswith("train.py")  # a train.py process made it
        assert (model["type"], model["block_size"]) == (type, 16)  # the overrides reached it
        assert read_metrics(out, "eval")[-1]["iter"] == 8
    result = lm.cached_lm(ctx)
    assert result.corpus == "corpus.txt"
    for name in lm.NAMES:  # each equal-time run was a train.py run on a time budget, at the equal-token recipe
        train_cfg = json.loads((Path(result.timed[name][0].out) / "config.json").read_text())["config"]["train"]
        assert (train_cfg["optimizer"], train_cfg["time_budget_s"]) == (result.tuned[name].recipe.optimizer,
                                                                        result.budget_s)
    assert {p.name for p in ctx.out.glob("*.png")} == {"lm.png", "gradient_paths.png"}
    assert any(r["experiment"] == "paths" and r["measure"].startswith("trained: gradient") for r in ctx.rows)


@pytest.mark.slow
def test_a_reader_of_the_lm_runs_trains_them_when_missing_each_model_tuned_on_both_optimizers(tiny_report,
                                                                                              monkeypatch):
    ctx = tiny_report
    in_process(monkeypatch)
    lm.lm_results(ctx)
    grid_points = len(ctx.grid)
    lm.lm_results(ctx)
    assert len(ctx.grid) == grid_points  # the second reader reused the runs
    result = lm.cached_lm(ctx)
    grid = [p for p in ctx.grid if p["experiment"] == "lm" and p["setting"].startswith("context=16 ")
            and "time=" not in p["setting"]]  # equal tokens
    for name in lm.NAMES:
        for optimizer in ("adamw", "muon"):
            tuned = result.optimizer(name, optimizer)
            selection = {p["lr"]: p["value"] for p in grid if p["model"] == name and p["metric"] == "selection loss"
                         and p["seed"] == 0 and p["setting"].split()[1] == optimizer}
            lrs = dict(TINY.adamw_lrs if optimizer == "adamw" else TINY.muon_lrs)[name]
            assert set(lrs) <= set(selection)  # every grid point is in the grid table (widened or not)
            assert sorted(selection) == tuned.lrs  # the rows name the grid tried
            assert tuned.recipe.grid_lr == min(selection, key=selection.get)  # the selection loss, not the test's
            assert sorted(tuned.runs) == [0, 1, 2]
        muon = result.optimizer(name, "muon")
        assert muon.recipe.lr == result.optimizer(name, "adamw").recipe.lr  # its AdamW part at AdamW's choice
        best = result.tuned[name]
        assert best.recipe in (result.optimizer(name, "adamw").recipe, muon.recipe)
        assert lm.best_run(ctx, name) == Path(best.runs[0].out)
        assert [r.seed for r in result.timed[name]] == [0, 1, 2]
        assert {r.recipe for r in result.timed[name]} == {best.recipe}  # the equal-token recipe, not tuned again
    capped = [p for p in ctx.grid if "time=" not in p["setting"]]
    assert {p["steps"] for p in capped} == {TINY.steps}  # every equal-token run, of both models, to the same cap
    batch = {json.loads((d / "config.json").read_text())["config"]["train"]["batch_size"]
             for d in (lm.RUNS / "lm").iterdir() if d.is_dir()}
    assert batch == {TINY.batch_size}


def fake_run(out="run", seed=0, recipe=Recipe("adamw", 1e-3), test=2.0):
    return lm.LMRun(out, recipe, seed, 8, 1.5, [(0.5, 3.0), (1.5, 2.5)], test + 0.1, test, [test] * 4, False)


def fake_result(tmp_path):
    """An LMResult as train_lm leaves it: each model's AdamW and Muon grids, the best with the other in others."""
    plan = lm.Plan(str(tmp_path), 16, 4, 8, 2, 1, None, 8)
    models = {n: lm.LMModel(n, [f"model.n_embd={w}"], f"1x{w} {n}", 1, 1000 + w) for n, w in (("gpt", 16),
                                                                                              ("lstm", 20))}
    result = lm.LMResult("quick", "corpus.txt", 30, 3.1, plan, models, budget_s=1.5,
                         ngram={2: (1.0, 2.6), 3: (0.1, 2.3)})
    for n, lr in (("gpt", 3e-3), ("lstm", 1e-2)):
        adamw, muon = Recipe("adamw", lr), Recipe("muon", lr, 0.04)
        runs = {r: {s: fake_run(f"{n}-{r.optimizer}-{s}", s, r, 2.0 + s / 10) for s in (0, 1)} for r in (adamw, muon)}
        best = Tuned(muon, [(Recipe("muon", lr, 0.02), -2.3), (muon, -2.2)], False, runs[muon])
        best.others = [Tuned(adamw, [(Recipe("adamw", lr / 2), -2.5), (adamw, -2.4)], True, runs[adamw])]
        result.tuned[n] = best
        result.timed[n] = [fake_run(f"{n}-timed-{s}", s, muon, 1.9) for s in (0, 1)]
    return result


def test_the_lm_result_saves_and_loads_as_it_was_while_its_checkpoints_are_there(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = fake_result(tmp_path)
    ctx = Context("quick", torch.device("cpu"), tmp_path, data_path="corpus.txt")
    assert lm.cached_lm(ctx) is None  # before the lm training
    lm.save_results(lm.RESULT, [result])
    assert json.loads(lm.RESULT.read_text())[0]["tuned"]["gpt"]["recipe"] == dict(optimizer="muon", lr=3e-3,
                                                                                  muon_lr=0.04)
    assert lm.cached_lm(ctx) is None  # the runs' checkpoints are not there
    for name in lm.NAMES:
        for run in [*result.runs(name), *result.timed[name]]:
            Path(run.out).mkdir()
            Path(run.out, "ckpt.pt").touch()
    loaded = lm.cached_lm(ctx)
    assert asdict(loaded) == asdict(result) and loaded.ngram == result.ngram
    assert loaded.optimizer("lstm", "adamw").recipe == Recipe("adamw", 1e-2) and loaded.optimizer("lstm", "adamw").edge
    assert [r.seed for r in loaded.runs("gpt")] == [0, 1] and lm.best_run(ctx, "gpt") == Path("gpt-muon-0")
    assert lm.cached_lm(replace(ctx, preset="full")) is None  # another preset's runs


def test_equal_time_runs_train_through_train_py_time_budget(tiny_report, monkeypatch):
    """An equal-time run gets train.time_budget_s and a step cap far past it, and the seconds, not the cap, end it;
    a Muon recipe passes both its lrs."""
    ctx, calls = tiny_report, []
    def train_in_process(overrides):
        calls.append(overrides)
        train(compose(*overrides))
    monkeypatch.setattr(lm, "run_train_py", train_in_process)
    monkeypatch.setattr(RunLog, "plot", lambda self: None)
    data_dir, _, models = lm.pair_models(ctx, TINY.gpt, TINY.block_size)
    run = lm.lm_run(ctx, lm.Plan.of(data_dir, TINY), "lm", models["lstm"], "context=16 time=0.3s",
                    Recipe("muon", 3e-3, 0.02), 1, seconds=0.3)
    cap = lm.MAX_ITERS_PER_CAP * TINY.steps
    [overrides] = calls
    assert {"train.time_budget_s=0.3", "train.optimizer=muon", f"train.max_iters={cap}", "train.learning_rate=0.003",
            "train.muon_lr=0.02", "train.seed=1"} <= set(overrides)
    assert 0 < run.iters < cap and run.seconds >= 0.3  # the budget, not the cap, ended it
    assert json.loads((Path(run.out) / "config.json").read_text())["config"]["train"]["time_budget_s"] == 0.3
    assert run.recipe == Recipe("muon", 3e-3, 0.02) and len(run.by_position) == 16 and run.select > 0
    points = [p for p in ctx.grid if p["setting"] == "context=16 time=0.3s muon adamw_lr=0.003"]
    assert [(p["metric"], p["lr"], p["seed"]) for p in points] == [("selection loss", 0.02, 1), ("test loss", 0.02, 1)]


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
