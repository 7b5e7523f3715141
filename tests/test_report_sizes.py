"""scripts/report/sizes.py: the size ladder end to end on tiny models (train.py's train in-process; the smallest size
is the lm experiment's), the recipe carried to larger sizes, the FLOPs count against a hand computation and the
verdict's rule (context.sizes_status) on synthetic numbers, its regime check first."""
import math

import pytest
import torch
from conftest import WORDS, compose, words_corpus

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from attnlab.record import RunLog
from scripts.report import Context, context, lm, sizes
from scripts.report.protocol import Recipe
from train import train

LM_TINY = dict(gpt=["model.n_layer=1", "model.n_head=2", "model.n_embd=16"], block_size=16, batch_size=4, steps=8,
               adamw_lrs=dict(gpt=[1e-2], lstm=[3e-2]), muon_lrs=dict(gpt=[0.05], lstm=[0.07]), grid_seeds=1, seeds=2,
               evals=2, eval_iters=1, select_windows=4, test_windows=8, windows=[8])
TINY = dict(gpt=[(1, 2, 32)], seeds=1)


def test_sizes_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(lm.BUDGET, "quick", LM_TINY)
    monkeypatch.setitem(sizes.BUDGET, "quick", TINY)
    monkeypatch.setattr(lm, "train_run", lambda overrides: train(compose(*overrides)))  # in-process: seconds
    monkeypatch.setattr(RunLog, "plot", lambda self: None)
    ctx = Context("quick", torch.device("cpu"), tmp_path / "report", str(words_corpus(tmp_path / "corpus.txt")))
    ctx.out.mkdir()
    sizes.exp_sizes(ctx)  # finds no lm runs and trains them first
    assert (ctx.out / "sizes.png").exists()
    result = lm.load_lm()
    rows = {r["measure"]: r for r in ctx.rows if r["experiment"] == "sizes"}
    by_size = rows["test loss by size, final weights"]
    vocab = len(set("".join(WORDS)) | {" "})
    for side in ("gpt", "lstm"):
        losses = [float(v.split(" [")[0]) for v in by_size[side].split(" / ")]
        assert len(losses) == 2 and all(0 < v < math.log(vocab) for v in losses)  # better than uniform over chars
    assert "muP" in by_size["note"] and "bigram" in by_size["note"]
    points = [p for p in ctx.grid if p["experiment"] == "sizes"]
    assert {(p["model"], p["seed"]) for p in points} == {("gpt", 0), ("lstm", 0)}  # the larger size only, seed 0
    ladder = sizes.size_ladder(ctx, TINY, result)
    for name in lm.NAMES:  # the lm experiment's recipe, its AdamW part's lr x the smaller width / the larger
        small, large = (size["width"] for size in ladder[name])
        [lr] = {p["lr"] for p in points if p["model"] == name}
        assert large > small and lr == sizes.scaled_recipe(result.tuned[name].recipe, small, large).grid_lr
    [verdict] = [v for v in ctx.verdicts if v["experiment"] == "sizes"]
    assert verdict["rule"] == context.SIZES_RULE and verdict["status"].startswith("not shown here (not reached")
    assert verdict["status"] in rows["gap, LSTM - GPT test loss, by size"]["note"]


def test_a_larger_size_takes_the_recipe_with_its_adamw_lr_scaled_as_mup_predicts():
    assert sizes.scaled_recipe(Recipe("muon", 4e-3, 0.04), 64, 128) == Recipe("muon", 2e-3, 0.04)
    assert sizes.scaled_recipe(Recipe("adamw", 1e-2), 75, 150) == Recipe("adamw", 5e-3)


def test_train_flops_by_hand():
    gpt = build_model(ModelConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16))
    # ln_1 16 + c_attn 768 + c_proj 256 + q/k norms 8 + 8 + ln_2 16 + c_fc 1024 + c_proj 1024 + ln_f 16 = 3136,
    # plus the tied head 20 x 16 = 320; attention 6 x 1 layer x 8 positions x 16 wide
    assert sizes.train_flops(gpt, 10) == 10 * (6 * (3136 + 320) + 6 * 1 * 8 * 16)
    lstm = build_model(ModelConfig(type="lstm", vocab_size=20, block_size=8, n_layer=1, n_embd=8, tie_weights=False))
    # W_ih 4 x 8 x 8 + W_hh 256 + two biases of 32 + the untied head 20 x 8 (the embedding's lookup costs none)
    assert sizes.train_flops(lstm, 10) == 10 * 6 * (256 + 256 + 32 + 32 + 160)


GROWS = [[0.1, 0.12, 0.11], [0.2, 0.22, 0.21], [0.4, 0.42, 0.41]]  # LSTM - GPT per seed, by size: apart, growing


@pytest.mark.parametrize("tokens_per_param, seeds, gaps, status", [
    ([40, 25, 20], [3, 3, 3], GROWS, "shown here"),
    ([40, 25, 20], [3, 3, 3], GROWS[::-1], "contradicted here"),
    ([40, 25, 20], [3, 3, 3], [[0.1, 0.3, 0.2], [0.2, 0.22, 0.21], [0.25, 0.15, 0.2]], "not shown here"),
    # below the regime, however the gap moves
    ([2.6, 0.6], [3, 1], GROWS[:2], "not shown here (not reached at this scale: 0.6-2.6 tokens per parameter)"),
    ([40, 25, 20], [3, 3, 1], GROWS, "not shown here (not reached at this scale: 20-40 tokens per parameter)"),
    ([40, 25, 19], [3, 3, 3], GROWS, "not shown here (not reached at this scale: 19-40 tokens per parameter)"),
])
def test_the_sizes_verdict_decides_only_in_the_data_rich_regime(tokens_per_param, seeds, gaps, status):
    assert context.sizes_status(tokens_per_param, seeds, gaps) == status


@pytest.mark.parametrize("preset", sorted(sizes.BUDGET))
def test_every_presets_ladder_composes_into_valid_models(preset):
    for n_layer, n_head, n_embd in sizes.BUDGET[preset]["gpt"]:  # compose raises on a width n_head does not divide
        assert compose(f"model.n_layer={n_layer}", f"model.n_head={n_head}", f"model.n_embd={n_embd}").model.n_embd
    assert compose(*lm.BUDGET[preset]["gpt"]).model.n_layer >= 1
