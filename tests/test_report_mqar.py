"""scripts/report/mqar.py: the rule on scripted numbers both ways, the budgets, and the experiment end to end on a tiny
budget."""
import pytest
import torch

from scripts.report import STATUSES, Context, mqar
from scripts.report.mqar import Point, mqar_status, mqar_verdict
from scripts.report.tasks import MODELS, SEEDS


def point(name, width, test, bytes_per_pair):
    """A Point with test accuracy test[pairs] on both seeds (a tuple: one each) and bytes_per_pair x pairs bytes (0: a
    fixed 1,000 B)."""
    return Point(name, width, None, {n: bytes_per_pair * n or 1000 for n in test},
                 {n: list(acc) if isinstance(acc, tuple) else [acc, acc] for n, acc in test.items()})


GPT = [point("gpt", 16, {4: 1.0, 16: 1.0}, 1000), point("gpt", 32, {4: 1.0, 16: 1.0}, 2000)]


@pytest.mark.parametrize("lstm, mingru, status, why", [
    ({4: 0.95, 16: 0.3}, {4: 1.0, 16: 0.5}, "shown here", "solves 4 pairs but every width fails 16"),
    ({4: 0.95, 16: 0.3}, {4: 1.0, 16: 0.95}, "contradicted here", "width 64 (1,000 B) solves 16 pairs"),
    ({4: 0.3, 16: 0.3}, {4: 1.0, 16: 0.5}, "not shown here", "no width solves even 4 pairs"),
    ({4: 0.95, 16: (0.95, 0.5)}, {4: 1.0, 16: 0.5}, "not shown here", "no pair count that the narrowest GPT solves"),
])
def test_mqar_rule_follows_the_numbers(lstm, mingru, status, why):
    points = [*GPT, point("lstm", 64, lstm, 0), point("mingru", 64, mingru, 0)]
    evidence, decided = mqar_verdict(points, (4, 16))
    assert decided == status and why in evidence


def test_mqar_rule_needs_a_gpt_that_solves():
    points = [point("gpt", 16, {4: 0.5}, 1000), point("lstm", 64, {4: 0.5}, 0)]
    assert mqar_status(points, (4,), "lstm") == ("not shown here", "no GPT width solves any pair count")


@pytest.mark.parametrize("preset", ["quick", "full"])
def test_every_budget_follows_the_protocol(preset):
    b = mqar.BUDGET[preset]
    assert len(b.adamw_lrs) >= 3 and len(b.muon_lrs) >= 3 and 1 <= b.tune_seeds <= b.seeds <= len(SEEDS)
    assert min(b.pairs) == 4 and max(b.pairs) <= min(32, b.keys) and b.steps <= 1000
    assert set(dict(b.widths)) == set(MODELS) and all(16 <= w <= 64 for w in dict(b.widths)["gpt"])


@pytest.fixture
def tiny_budget(monkeypatch, tmp_path):
    monkeypatch.setitem(mqar.BUDGET, "quick", mqar.MqarBudget(
        batch=4, adamw_lrs=(1e-3, 1e-2, 3e-2), muon_lrs=(0.02, 0.06, 0.18), widen=1, selection=8, test=16,
        pairs=(2, 4), keys=8, widths=(("gpt", (8,)), ("lstm", (8, 16)), ("mingru", (8,))), steps=4, eval_every=2,
        seeds=2))
    return Context("quick", torch.device("cpu"), tmp_path, hardware="test CPU")


def trained_recipes(ctx):
    return {(p["model"], p["setting"].rsplit(", ", 1)[1]) for p in ctx.grid}


def test_mqar_experiment_end_to_end(tiny_budget, one_thread):
    ctx = tiny_budget
    mqar.exp_mqar(ctx)
    assert {p.name for p in ctx.out.glob("*.png")} == {"mqar.png", "mqar_attention.png"}
    two, four, recipes = ctx.rows
    assert two["measure"].startswith("2 pairs (6 tokens): test accuracy % by width (bytes of state)")
    assert "(768 B)" in two["gpt"] and "(1,536 B)" in four["gpt"]  # the KV cache grows with the pairs
    assert "8: " in four["lstm"] and "(128 B)" in four["lstm"] and "(256 B)" in four["lstm"]  # h and c: 16 x width
    assert "(64 B)" in four["mingru"] and "chance (1/pairs) 25.0%" in four["note"]
    assert recipes["lstm"].count(" of ") == 2
    settings_trained = {(p["model"], p["setting"]) for p in ctx.grid}
    assert {s.split(", ")[0] for m, s in settings_trained if m == "lstm"} == {"width 8", "width 16"}
    assert trained_recipes(ctx) == {(m, o) for m in ("gpt", "lstm", "mingru") for o in ("adamw", "muon")}
    (verdict,) = ctx.verdicts
    assert verdict["experiment"] == "mqar" and verdict["rule"] == mqar.RULE
    assert verdict["status"] in STATUSES and "LSTM: " in verdict["evidence"] and "minGRU: " in verdict["evidence"]
