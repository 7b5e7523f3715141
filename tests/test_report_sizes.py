"""scripts/report/sizes.py: the data-rich ladder end to end on tiny models (train.py's train in-process): every run
at the stated tokens per parameter, each size tuned on its own grids, the results saved for the context experiment;
the verdict's rule (sizes_status) both ways on synthetic numbers."""
import json
import math

import pytest
import torch
from conftest import WORDS, compose, words_corpus

from attnlab.record import RunLog
from scripts.report import Context, lm, sizes
from scripts.report.protocol import Recipe, Tuned
from train import train

TINY = sizes.Budget(gpt=((1, 2, 8), (1, 2, 16), (1, 2, 24)), block_size=16, batch_size=4,
                    muon_lrs=(("gpt", (0.02, 0.05)), ("lstm", (0.05, 0.1))),
                    adamw_lrs=(("gpt", (3e-3, 1e-2)), ("lstm", (3e-3, 1e-2))), widen=1, seeds=3, evals=2, eval_iters=1,
                    select_windows=4, test_windows=8, train_windows=4)


@pytest.fixture
def tiny_sizes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sizes.BUDGET, "quick", TINY)
    monkeypatch.setattr(sizes, "TOKENS_PER_PARAM", 0.05)  # tiny runs: the rule's regime is its argument here
    monkeypatch.setattr(lm, "run_train_py", lambda overrides: train(compose(*overrides)))  # in-process: seconds
    monkeypatch.setattr(RunLog, "plot", lambda self: None)
    ctx = Context("quick", torch.device("cpu"), tmp_path / "report", str(words_corpus(tmp_path / "corpus.txt")))
    ctx.out.mkdir()
    return ctx


@pytest.mark.slow
def test_sizes_end_to_end(tiny_sizes):
    ctx = tiny_sizes
    sizes.exp_sizes(ctx)
    assert (ctx.out / "sizes.png").exists()
    results = sizes.cached_sizes(ctx)  # saved and read back, every run's checkpoint there
    assert [r.models["gpt"].desc.split()[0] for r in results] == ["1x8", "1x16", "1x24"]
    for r in results:
        params = max(m.params for m in r.models.values())
        assert r.plan.tokens >= sizes.TOKENS_PER_PARAM * params > r.plan.tokens - r.plan.batch_size * r.plan.block_size
        for name in lm.NAMES:
            tuned = r.tuned[name]
            assert sorted(tuned.runs) == [0, 1, 2] and tuned.recipe.optimizer == "muon"
            assert tuned.recipe.muon_lr == tuned.others[0].recipe.muon_lr  # the lr grid ran at the chosen muon_lr
            assert {rec.lr for rec, _ in tuned.tried} >= set(dict(TINY.adamw_lrs)[name])
    rows = {r["measure"]: r for r in ctx.rows if r["experiment"] == "sizes"}
    vocab = len(set("".join(WORDS)) | {" "})
    for side in ("gpt", "lstm"):
        losses = [float(v.split(" [")[0]) for v in rows["test loss by size, final weights"][side].split(" / ")]
        assert len(losses) == 3 and all(0 < v < math.log(vocab) for v in losses)
    [verdict] = [v for v in ctx.verdicts if v["experiment"] == "sizes"]
    assert verdict["rule"] == sizes.RULE
    assert verdict["status"] in rows["gap, LSTM - GPT test loss, by size"]["note"]
    # every run a recipe trained once: seeds 1-2 only at the chosen recipe, grid points on seed 0
    points = [(p["model"], p["setting"], p["lr"], p["seed"]) for p in ctx.grid if p["metric"] == "test loss"]
    assert len(points) == len(set(points))
    assert len(json.loads(sizes.RESULT.read_text())) == 3


def result(gpt, lstm, tokens=100, params=5):
    """An LMResult of one size holding what sizes_status reads: the test losses per seed and the budget."""
    plan = lm.Plan("", 4, 1, tokens // 4, 1, 1, None, None)
    models = {n: lm.LMModel(n, [], n, 1, params) for n in lm.NAMES}
    out = lm.LMResult("quick", "c", 10, 2.0, plan, models)
    for name, losses in (("gpt", gpt), ("lstm", lstm)):
        runs = {s: lm.LMRun("", Recipe("muon", 1e-3, 0.05), s, 1, 1.0, [], v, v, [], False) for s, v in
                enumerate(losses)}
        out.tuned[name] = Tuned(Recipe("muon", 1e-3, 0.05), [], False, runs)
    return out


@pytest.mark.parametrize("gaps, status", [
    ([0.01, 0.03, 0.10], "shown here"),  # the GPT ahead at the largest size, the gap growing
    ([0.10, 0.10, 0.10], "not shown here"),  # ahead but not growing
    ([-0.05, -0.08, -0.10], "contradicted here"),  # the LSTM ahead at the largest, pulling away
    ([-0.10, -0.10, -0.10], "contradicted here"),  # ahead, the gap not growing toward the GPT
    ([-0.20, -0.10, -0.05], "not shown here"),  # the LSTM ahead, but losing ground as the models grow
    ([-0.20, -0.10, -0.01], "not shown here"),  # under the material difference at the largest size
])
def test_the_sizes_verdict_follows_the_numbers_both_ways(gaps, status):
    seeds = [0.0, 0.002, -0.002]
    results = [result([1.5 + s for s in seeds], [1.5 + g + s for s in seeds]) for g in gaps]
    assert sizes.sizes_status(results) == status


def test_the_sizes_verdict_needs_three_sizes_at_the_data_rich_ratio():
    rich = [result([1.5, 1.51, 1.49], [1.7, 1.71, 1.69]) for _ in range(3)]
    assert sizes.sizes_status(rich[:2]).startswith("not shown here (fewer than 3 sizes")
    starved = [result([1.5, 1.51, 1.49], [1.7, 1.71, 1.69], tokens=40, params=5) for _ in range(3)]
    assert sizes.sizes_status(starved).startswith("not shown here (fewer than 3 sizes")
