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
            seeds=2, evals=2, eval_iters=1, select_windows=8, test_windows=8)


@pytest.fixture
def tiny_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sizes.BUDGET, "quick", TINY)
    monkeypatch.setattr(lm, "train_run", lambda overrides: train(compose(*overrides)))  # in-process: seconds
    monkeypatch.setattr(RunLog, "plot", lambda self: None)
    ctx = Context("quick", torch.device("cpu"), tmp_path / "report", str(words_corpus(tmp_path / "corpus.txt")))
    ctx.out.mkdir()
    return ctx


def test_sizes_end_to_end(tiny_report):
    ctx = tiny_report
    sizes.exp_sizes(ctx)
    assert (ctx.out / "sizes.png").exists()
    rows = {r["measure"]: r for r in ctx.rows}
    by_size = rows["test loss by size, final weights, seed 0"]
    for side in ("gpt", "lstm"):
        losses = [float(v) for v in by_size[side].split(" / ")]
        vocab = len(set("".join(WORDS)) | {" "})
        assert len(losses) == 2 and all(0 < v < math.log(vocab) for v in losses)  # better than uniform over chars
    assert "scaled as 1/width" in by_size["note"] and "bigram" in by_size["note"] and "trigram" in by_size["note"]
    gap = rows["gap, LSTM - GPT test loss, smallest / largest size"]
    [verdict] = ctx.verdicts
    assert verdict["experiment"] == "sizes" and verdict["reason"] == "b" and verdict["status"] in gap["note"]
    # every run in the grid: 2 models x (the grid's lr at seed 0, seed 1 at it, the larger size), two metrics each
    assert len(ctx.grid) == 2 * 3 * 2 and {p["steps"] for p in ctx.grid} == {TINY["steps"]}
    gpt = {int(p["setting"].split("=")[1]): p["lr"] for p in ctx.grid if p["model"] == "gpt"}
    assert gpt[max(gpt)] == pytest.approx(gpt[min(gpt)] * 16 / 32)  # 1/width from the smallest size's lr


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
