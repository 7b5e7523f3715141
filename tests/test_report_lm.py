"""scripts/report/lm.py: the language-model experiments end to end on tiny models (train.py trains them, their
checkpoints are scored, rows, grid points and figures are written), and the measures they report: the loss at each
position, where it stops improving, and a model run at twice its training length."""
import json
import math
from dataclasses import asdict

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
            lrs=dict(gpt=[1e-3, 1e-2, 3e-2], lstm=[3e-3, 3e-2]), grid_seeds=1, seeds=2, evals=4, eval_iters=2,
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
    return float(cell.split(" ± ")[0])


@pytest.mark.slow
def test_lm_trains_both_models_with_train_py(tiny_report, monkeypatch):
    ctx = tiny_report
    monkeypatch.setitem(lm.BUDGET, "quick", {**TINY, "lrs": dict(gpt=[1e-2], lstm=[3e-2]), "seeds": 1})
    lm.exp_lm(ctx)
    gradient_paths(ctx)  # reads the best runs' checkpoints back
    for name, type in (("gpt", "gpt"), ("lstm", "lstm")):
        out = lm.best_run(name)
        receipt = json.loads((out / "config.json").read_text())
        model = receipt["config"]["model"]
        assert receipt["argv"][0].endswith("train.py")  # a train.py process made it
        assert (model["type"], model["block_size"]) == (type, 16)  # the overrides reached it
        assert read_metrics(out, "eval")[-1]["iter"] == 8
    assert lm.lm_summary()["corpus"] == "corpus.txt"
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

    grid = [p for p in ctx.grid if p["experiment"] == "lm"]
    for name in ("gpt", "lstm"):
        chosen = summary[name]["lr"]
        selection = {p["lr"]: p["value"] for p in grid if p["model"] == name and p["metric"] == "selection loss"
                     and p["seed"] == 0}
        assert sorted(selection) == TINY["lrs"][name]  # every grid point is in the grid table
        assert chosen == min(selection, key=selection.get)  # the lowest selection loss, not the test loss
        assert {p["seed"] for p in grid if p["model"] == name and p["lr"] == chosen} == {0, 1}
        assert lm.best_run(name) == lm.RUNS / "lm" / f"{name}-context16-lr{chosen:g}-seed0"
    assert {p["steps"] for p in ctx.grid} == {TINY["steps"]}  # every run, of both models, to the same cap
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
    assert "lr" in test["note"] and "still improving" in test["note"]
    assert len(rows["test loss at positions 1-8 / 9-16"]["gpt"].split(" / ")) == 2
    assert "too short" in rows["position after which the loss falls by less than 1% to position 16"]["note"]
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


def test_saturation_finds_where_the_loss_stops_falling():
    p = torch.arange(1, 257).float()
    starts, means = lm.half_octaves(torch.stack([p, 2 * p]))
    assert starts == [1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128, 181]
    assert means[:, -1].tolist() == [218.5, 437.0] and means[:, 3].tolist() == [4.5, 9.0]  # 181-256 and 4-5
    assert lm.saturation(torch.full((256,), 2.0)) == 1
    assert lm.saturation(torch.where(p <= 100, 3 - p / 100, 2.0)) == 91  # falls until 100, then flat
    assert lm.saturation(3 - p / 256) == 181  # still falling at the end: the last bin


def test_kaplan_finding_is_read_off_both_curves():
    p = torch.arange(1, 257).float()
    flat_after_100, still_falling = torch.where(p <= 100, 3 - p / 100, 2.0), 3 - p / 256
    holds = lm.kaplan_note({"gpt": still_falling[None], "lstm": flat_after_100[None]}, 256)
    assert " holds here" in holds and "position 181 (gpt) / 91 (lstm)" in holds
    assert "does not hold" in lm.kaplan_note({"gpt": flat_after_100[None], "lstm": flat_after_100[None]}, 256)
