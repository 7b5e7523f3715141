"""scripts/report/induction.py: the rule on scripted numbers, a capped GPT making no bound, the budgets, and the
experiment end to end on a tiny budget."""
import pytest
import torch

from scripts.report import STATUSES, Context, induction
from scripts.report.induction import Speed, induction_verdict, speed_status
from scripts.report.tasks import SEEDS


def speeds(gpt90, gpt99, lstm90, mingru90, cap=400):
    return {"gpt": {0.9: Speed(gpt90, cap), 0.99: Speed(gpt99, cap)},
            "lstm": {0.9: Speed(lstm90, cap), 0.99: Speed([None] * len(lstm90), cap)},
            "mingru": {0.9: Speed(mingru90, cap), 0.99: Speed([None] * len(mingru90), cap)}}


@pytest.mark.parametrize("case, status", [
    (([100, 120], [140, 160], [None, None], [300, 250]), "shown here"),  # ratios >= 400/120 and 250/120 > 2
    (([100, 120], [140, 160], [None, None], [300, 200]), "not shown here"),  # minGRU 200/120 < 2
    (([100, 120], [140, None], [None, None], [300, 300]), "not shown here"),  # a GPT seed short of 99%
    (([100, 120], [140, 160], [90, 100], [None, None]), "contradicted here"),  # every LSTM seed as fast
    (([100, 120], [140, 160], [90, 110], [None, None]), "not shown here"),  # 110 / 100 > 1
])
def test_induction_rule_follows_the_numbers(case, status):
    evidence, decided = induction_verdict(speeds(*case))
    assert decided == status
    assert evidence.startswith(f"steps to 90%: GPT {case[0][0]} / {case[0][1]}; LSTM ")
    if case[2] == [None, None]:
        assert ("LSTM >400 / >400, ratio to the GPT 3.6 (3.3-4.0), a lower bound, the cap 400 over the GPT's steps: 2 "
                "of 2 seeds not there by the cap") in evidence


def test_a_capped_gpt_makes_no_bound():
    gpt, other = Speed([100, None], 400), Speed([None, None], 400)
    assert speed_status(gpt, gpt, other) == "not shown here"
    assert "no bound: 1 of 2 GPT seeds" in induction.ratio_text(other, gpt)


@pytest.mark.parametrize("preset", ["quick", "full"])
def test_every_budget_follows_the_protocol(preset):
    b = induction.BUDGET[preset]
    assert len(b.adamw_lrs) >= 3 and len(b.muon_lrs) >= 3 and b.seeds >= 5
    assert 1 <= b.tune_seeds <= b.seeds <= len(SEEDS) and b.steps <= 1000


@pytest.fixture
def tiny_budget(monkeypatch, tmp_path):
    monkeypatch.setitem(induction.BUDGET, "quick", induction.InductionBudget(
        batch=4, adamw_lrs=(1e-3, 1e-2, 3e-2), muon_lrs=(0.02, 0.06, 0.18), widen=1, selection=8, test=16, n_embd=16,
        steps=4, eval_every=2, seeds=3))
    return Context("quick", torch.device("cpu"), tmp_path, hardware="test CPU")


def trained_recipes(ctx):
    return {(p["model"], p["setting"].rsplit(", ", 1)[1]) for p in ctx.grid}


def test_induction_experiment_end_to_end(tiny_budget, one_thread):
    ctx = tiny_budget
    induction.exp_induction(ctx)
    assert {p.name for p in ctx.out.glob("*.png")} == {"induction.png"}
    to90, to99, accuracy, attention = ctx.rows
    assert to90["measure"].startswith("steps to 90% test accuracy") and to99["measure"].startswith("steps to 99%")
    # the steps come from the test set's curve, scored at every eval beside the selection set and never chosen on
    assert {p["metric"] for p in ctx.grid} >= {"steps to 90% test accuracy", "steps to 90% selection accuracy"}
    assert all(len(to90[name].split(" / ")) == 3 for name in ("gpt", "lstm", "mingru"))
    assert "ratio to the GPT" in to90["note"] and "minGRU" in to90["note"]
    assert "chance uniform over the 32 tokens 3.1%" in accuracy["note"] and accuracy["mingru"]
    assert attention["gpt"].count("%") == 2
    assert trained_recipes(ctx) == {(m, o) for m in ("gpt", "lstm", "mingru") for o in ("adamw", "muon")}
    (verdict,) = ctx.verdicts
    assert verdict["rule"] == induction.RULE and verdict["status"] in STATUSES
