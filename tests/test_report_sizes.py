"""scripts/report/sizes.py: the size ladder end to end on tiny models (train.py's train in-process), the FLOPs count
against a hand computation and the verdict's rule both ways (the n-gram references are lm's, tested there)."""
import math

import pytest
import torch
from conftest import WORDS, compose, words_corpus

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from attnlab.record import RunLog
from scripts.report import Context, lm, sizes
from train import train

TINY = dict(gpt=[(1, 2, 16), (1, 2, 32)], block_size=16, batch_size=4, steps=8, lrs=dict(gpt=[1e-2], lstm=[3e-2]),
            retune=(0.5, 1, 2), seeds=2, evals=2, eval_iters=1, select_windows=8, test_windows=8)


@pytest.fixture
def tiny_report(tmp_path, monkeypatch, request):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sizes.BUDGET, "quick", TINY | dict(retune=getattr(request, "param", TINY["retune"])))
    monkeypatch.setattr(lm, "train_run", lambda overrides: train(compose(*overrides)))  # in-process: seconds
    monkeypatch.setattr(RunLog, "plot", lambda self: None)
    ctx = Context("quick", torch.device("cpu"), tmp_path / "report", str(words_corpus(tmp_path / "corpus.txt")))
    ctx.out.mkdir()
    return ctx


@pytest.mark.parametrize("tiny_report", [(0.5, 1, 2), (1,)], indirect=True)
def test_sizes_end_to_end(tiny_report):
    ctx, retune = tiny_report, sizes.BUDGET["quick"]["retune"]
    sizes.exp_sizes(ctx)
    assert (ctx.out / "sizes.png").exists()
    rows = {r["measure"]: r for r in ctx.rows}
    by_size = rows["test loss by size, final weights, seed 0"]
    for side in ("gpt", "lstm"):
        losses = [float(v) for v in by_size[side].split(" / ")]
        vocab = len(set("".join(WORDS)) | {" "})
        assert len(losses) == 2 and all(0 < v < math.log(vocab) for v in losses)  # better than uniform over chars
    assert "muP's prediction" in by_size["note"] and "bigram" in by_size["note"] and "trigram" in by_size["note"]
    gap = rows["gap, LSTM - GPT test loss, smallest / largest size"]
    [verdict] = ctx.verdicts
    assert verdict["experiment"] == "sizes" and verdict["reason"] == "b" and verdict["status"] in gap["note"]
    assert {p["steps"] for p in ctx.grid} == {TINY["steps"]}
    _, ladder = sizes.models(ctx, sizes.BUDGET["quick"])
    for name in ("gpt", "lstm"):
        points = [p for p in ctx.grid if p["model"] == name and p["metric"] == "selection loss"]
        small, large = sorted({p["setting"] for p in points}, key=lambda s: int(s.split("=")[1]))
        # the smallest size: its one-lr grid at seed 0, then seed 1 at it
        assert [(p["lr"], p["seed"]) for p in points if p["setting"] == small] == [(TINY["lrs"][name][0], 0),
                                                                                   (TINY["lrs"][name][0], 1)]
        # the larger size: a grid around muP's 1/width prediction (widened while its best is at an end), seed 0 only
        tried = {p["lr"]: p["value"] for p in points if p["setting"] == large}
        predicted = TINY["lrs"][name][0] * ladder[name][0]["width"] / ladder[name][1]["width"]
        assert all(any(lr == pytest.approx(predicted * f, rel=1e-2) for lr in tried) for f in retune)
        assert len(tried) == 1 if retune == (1,) else 3 <= len(tried) <= 6  # at most 3 widenings
        best = min(tried, key=tried.get)
        assert f"{best:g} of [{', '.join(f'{lr:g}' for lr in sorted(tried))}]" in by_size["note"]


def test_train_flops_by_hand():
    gpt = build_model(ModelConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16))
    # ln_1 16 + c_attn 768 + c_proj 256 + q/k norms 8 + 8 + ln_2 16 + c_fc 1024 + c_proj 1024 + ln_f 16 = 3136,
    # plus the tied head 20 x 16 = 320; attention 6 x 1 layer x 8 positions x 16 wide
    assert sizes.train_flops(gpt, 10) == 10 * (6 * (3136 + 320) + 6 * 1 * 8 * 16)
    lstm = build_model(ModelConfig(type="lstm", vocab_size=20, block_size=8, n_layer=1, n_embd=8, tie_weights=False))
    # W_ih 4 x 8 x 8 + W_hh 256 + two biases of 32 + the untied head 20 x 8 (the embedding's lookup costs none)
    assert sizes.train_flops(lstm, 10) == 10 * 6 * (256 + 256 + 32 + 32 + 160)


@pytest.mark.parametrize("gaps, spread, status", [([0.1, 0.4], 0.1, "shown here"), ([0.4, 0.1], 0.1,
                         "contradicted here"), ([0.1, 0.15], 0.1, "not shown here"), ([0.3, 0.2], 0.2,
                         "not shown here")])
def test_verdict_follows_the_gap_against_the_seed_spread(gaps, spread, status):
    assert sizes.decide(gaps, spread) == status


@pytest.mark.parametrize("preset", sorted(sizes.BUDGET))
def test_every_presets_ladder_composes_into_valid_models(preset):
    for n_layer, n_head, n_embd in sizes.BUDGET[preset]["gpt"]:  # compose raises on a width n_head does not divide
        assert compose(f"model.n_layer={n_layer}", f"model.n_head={n_head}", f"model.n_embd={n_embd}").model.n_embd
    assert compose(*lm.BUDGET[preset]["gpt"]).model.n_layer >= 1
