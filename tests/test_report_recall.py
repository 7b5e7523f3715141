"""scripts/report/tasks.py and scripts/report/recall.py: the synthetic batches, equal sizes, the bytes of state each
model carries, the stopping rule, the lr/seed grid, and both experiments end to end on tiny budgets."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from model import KVCache
from scripts.report import Context, recall, tasks
from scripts.report.tasks import (
    Run,
    induction_batch,
    mixed_recall_batch,
    recall_batch,
    rnn_width,
    seed_grid,
    state_bytes,
    synthetic_models,
    train_synthetic,
    tune,
)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16, 64]), st.sampled_from([16, 64]), st.sampled_from([None, 200]),
       st.integers(0, 2**31))
def test_recall_targets_are_the_values_of_the_queried_keys(n_pairs, n_keys, seq_len, seed):
    if n_pairs > n_keys:
        return
    x, y = recall_batch(8, n_pairs, n_keys, seq_len, generator=torch.Generator().manual_seed(seed))
    length = seq_len or 3 * n_pairs
    assert x.shape == y.shape == (8, length)
    for row, target in zip(x.tolist(), y.tolist()):
        keys, values = row[0:2 * n_pairs:2], row[1:2 * n_pairs:2]
        assert len(set(keys)) == len(set(values)) == n_pairs
        assert all(1 <= k <= n_keys for k in keys) and all(n_keys < v <= 2 * n_keys for v in values)
        queries = [t for t, v in enumerate(target) if v >= 0]
        assert queries == list(range(2 * n_pairs, 3 * n_pairs))  # every key asked once, right after the pairs
        assert sorted(row[t] for t in queries) == sorted(keys)
        assert all(target[t] == values[keys.index(row[t])] for t in queries)
        assert row[3 * n_pairs:] == [0] * (length - 3 * n_pairs)


def test_recall_rejects_impossible_sizes():
    with pytest.raises(ValueError, match="pairs"):
        recall_batch(2, 17, n_keys=16)
    with pytest.raises(ValueError, match="seq_len"):
        recall_batch(2, 8, seq_len=20)


def test_mixed_recall_batches_draw_their_pairs_log_uniformly():
    generator = torch.Generator().manual_seed(0)
    pairs = []
    for _ in range(400):
        x, y = mixed_recall_batch(2, 4, 64, generator=generator)
        n = x.size(1) // 3
        assert x.size(1) == 3 * n and (y >= 0).sum().item() == 2 * n  # one size per batch, no filler
        pairs.append(n)
    assert min(pairs) == 4 and 56 <= max(pairs) <= 64
    short, long = sum(n <= 8 for n in pairs), sum(n >= 32 for n in pairs)  # a quarter of the log range each
    assert 60 < short < 140 and 60 < long < 140


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31))
def test_induction_targets_are_the_next_token_of_the_repeat(seed):
    x, y, lengths = induction_batch(8, generator=torch.Generator().manual_seed(seed))
    for row, target, S in zip(x.tolist(), y.tolist(), lengths.tolist()):
        assert 8 <= S <= 32
        first, second = row[:S], row[S:2 * S]
        assert first == second and len(set(first)) == S and 0 not in first and row[2 * S:] == [0] * (64 - 2 * S)
        scored = [t for t, v in enumerate(target) if v >= 0]
        assert scored == list(range(S, 2 * S - 1))  # inside the second copy, each with an earlier copy to look up
        assert all(target[t] == row[t + 1] for t in scored)


@pytest.mark.parametrize("vocab_size", [33, 129])
def test_synthetic_models_have_equal_size(vocab_size):
    configs = synthetic_models(vocab_size, 64)
    gpt, lstm = (build_model(configs[name]).num_params() for name in ("gpt", "lstm"))
    assert configs["gpt"].n_layer == configs["lstm"].n_layer == 2 and abs(lstm / gpt - 1) < 0.01


@pytest.mark.parametrize("type, gates, tied", [("lstm", 4, False), ("gru", 3, True), ("lstm", 4, True)])
def test_rnn_width_counts_parameters_like_the_model(type, gates, tied):
    width = rnn_width(200_000, 50, n_layer=3, gates=gates, tied=tied)
    model = build_model(ModelConfig(type=type, vocab_size=50, n_layer=3, n_embd=width, tie_weights=tied))

    def count(h):
        return 50 * h * (1 if tied else 2) + 3 * gates * (2 * h * h + 2 * h)

    assert model.num_params() == count(width)
    assert abs(count(width) - 200_000) <= min(abs(count(width + 1) - 200_000), abs(count(width - 1) - 200_000))


@pytest.mark.parametrize("width, n_head, n_kv_head", [(64, 1, None), (32, 4, 2)])
def test_gpt_state_bytes_are_its_kv_cache(width, n_head, n_kv_head):
    cfg = ModelConfig(vocab_size=20, n_layer=3, n_head=n_head, n_kv_head=n_kv_head, n_embd=width, block_size=192)
    for T in (12, 96, 192):
        assert state_bytes(cfg, T) == KVCache(cfg.architecture(), 1, T, "cpu", torch.float32).nbytes


@pytest.mark.parametrize("type", ["lstm", "gru"])
def test_rnn_state_bytes_are_its_state_after_any_length(type):
    cfg = ModelConfig(type=type, vocab_size=20, n_layer=2, n_embd=24, block_size=64)
    model = build_model(cfg)
    for T in (1, 50):
        cache = model.new_cache(1, "cpu", torch.float32)
        model(torch.zeros(1, T, dtype=torch.long), cache=cache)
        assert state_bytes(cfg, T) == cache.nbytes


def scripted_evaluate(monkeypatch, scores):
    """train_synthetic's evaluations return scores[i] = (accuracy, loss) at its i-th evaluation."""
    calls = iter(scores)
    monkeypatch.setattr(tasks, "evaluate", lambda model, x, y: next(calls))


TINY = ModelConfig(type="lstm", vocab_size=8, block_size=8, n_layer=1, n_embd=8)


def tiny_batch(it, g):
    return torch.randint(0, 8, (2, 8), generator=g), torch.randint(0, 8, (2, 8), generator=g)


EVALS = {"set": tiny_batch(0, torch.Generator().manual_seed(0))}


def test_training_stops_at_a_plateau_of_the_selection_loss_after_half_the_cap(monkeypatch):
    # 1.0 -> 0.9 sets a mark; the scores after it stay within 1% of it: three of them make a plateau
    plateau = [(0.1, 1.0), (0.2, 0.9)] + [(0.3, 0.895)] * 20
    for cap, stop in ((40, 20), (100, 50)):  # the plateau at step 20 ends a run only once half the cap is behind it
        scripted_evaluate(monkeypatch, plateau)
        run = train_synthetic(TINY, tiny_batch, cap, 1e-3, EVALS, torch.device("cpu"), eval_every=5, patience=3)
        assert run.curve[-1][0] == run.steps == stop and [step for step, _ in run.curve] == list(range(0, stop + 1, 5))
        assert run.select == 0.3 and not run.solved and not run.capped  # the plateau, not the cap, stopped it


def test_training_stops_at_the_target_accuracy_and_flags_a_capped_run(monkeypatch):
    scripted_evaluate(monkeypatch, [(0.5, 1.0), (0.996, 0.5)])
    run = train_synthetic(TINY, tiny_batch, 100, 1e-3, EVALS, torch.device("cpu"), eval_every=5)
    assert run.steps == 5 and run.solved and not run.capped
    scripted_evaluate(monkeypatch, [(0.1, 1.0), (0.2, 0.9), (0.3, 0.8)])  # still falling when the cap comes
    run = train_synthetic(TINY, tiny_batch, 10, 1e-3, EVALS, torch.device("cpu"), eval_every=5)
    assert run.steps == 10 and run.capped and not run.solved


def test_the_grid_records_every_run_and_chooses_on_the_selection_set(monkeypatch):
    selection = {1e-3: 0.5, 1e-2: 0.9, 3e-2: 0.7, 9e-2: 0.8}  # the test set prefers 3e-2: it must not decide
    test_score = {1e-3: 0.5, 1e-2: 0.6, 3e-2: 0.95, 9e-2: 0.1}
    steps = {1e-3: 7, 1e-2: 7, 3e-2: 7, 9e-2: 7}
    trained = []

    def fake_train(cfg, make_batch, cap, lr, evals, device, seed=0, **options):
        trained.append((lr, seed))
        return Run(model=lr, curve=[], steps=steps[lr], seconds=1.0, select=selection[lr],
                   solved=selection[lr] >= 0.995, capped=False)

    monkeypatch.setattr(tasks, "train_synthetic", fake_train)
    monkeypatch.setattr(tasks, "evaluate", lambda model, x, y: (test_score[model], 0.0))
    ctx = Context("quick", torch.device("cpu"), None)
    test = {"t": (torch.zeros(1, 2), torch.zeros(1, 2))}

    def grid(seeds, grid_seeds=1):
        return tune(ctx, "recall", "gpt", None, None, [1e-3, 1e-2, 3e-2], seeds, 7, {}, test, "width 64", grid_seeds)

    tuned = grid((0, 1, 2))
    assert trained == [(1e-3, 0), (1e-2, 0), (3e-2, 0), (1e-2, 1), (1e-2, 2)]
    assert tuned.lr == 1e-2 and not tuned.edge and set(tuned.runs) == {0, 1, 2}
    assert tuned.runs[1].test == {"t": 0.6} and tuned.seconds == 5.0  # every run of the grid, chosen or not
    points = [(p["lr"], p["seed"], p["metric"], p["value"]) for p in ctx.grid]
    assert len(points) == 3 * 5 and (3e-2, 0, "test accuracy t", 0.95) in points
    assert (1e-2, 2, "capped while improving (1 = yes)", 0) in points
    assert all(p["experiment"] == "recall" and p["setting"] == "width 64" and p["steps"] == 7 for p in ctx.grid)
    # lrs that solve the task tie on accuracy; the faster one wins, here the grid's top, every point with two seeds,
    # so the grid widens to 9e-2, which does not solve: 3e-2 is then inside
    selection.update({1e-2: 0.996, 3e-2: 0.999})
    steps.update({1e-2: 300, 3e-2: 200})
    trained.clear()
    tuned = grid((0, 1), grid_seeds=2)
    assert tuned.lr == 3e-2 and not tuned.edge and len(trained) == 8 and tuned.lrs == [1e-3, 1e-2, 3e-2, 9e-2]
    selection[3e-2] = 0.9  # short of stop_at: the lr that solves wins, however slow
    assert grid((0, 1), grid_seeds=2).lr == 1e-2


def test_gpt_learns_recall_in_a_short_seeded_run():
    evals = {4: recall_batch(256, 4, n_keys=16, generator=torch.Generator().manual_seed(1))}

    def make(it, g):
        return recall_batch(64, 4, n_keys=16, generator=g)

    run = train_synthetic(synthetic_models(33, 12)["gpt"], make, 300, 3e-3, evals, torch.device("cpu"), stop_at=0.97)
    assert run.curve[-1][1][4] >= 0.95, run.curve


def test_every_budget_follows_the_protocol():
    assert recall.BUDGET["quick"].keys() == recall.BUDGET["full"].keys()
    for budget in recall.BUDGET.values():
        assert all(len(budget["lrs"][name]) >= 3 and budget["widths"][name] for name in ("gpt", "lstm"))
        assert 1 <= budget["grid_seeds"] <= len(recall.SEEDS)  # the chosen lr then runs the remaining seeds
    assert len(recall.SEEDS) >= 2


@pytest.fixture
def tiny_budget(monkeypatch, tmp_path):
    monkeypatch.setitem(recall.BUDGET, "quick", dict(batch=4, recall_steps=3, induction_steps=3,
                                                     lrs={"gpt": (1e-3, 1e-2), "lstm": (1e-3, 1e-2)},
                                                     widths={"gpt": (16,), "lstm": (8,)}, grid_seeds=1,
                                                     selection=8, test=16))
    monkeypatch.setattr(recall, "TRAIN", dict(eval_every=2, patience=4, stop_at=0.995))
    ctx = Context("quick", torch.device("cpu"), tmp_path, hardware="test CPU")
    return ctx


def test_recall_experiment_end_to_end(tiny_budget, monkeypatch):
    monkeypatch.setattr(recall, "PAIRS", (2, 4, 8))
    monkeypatch.setattr(recall, "SHOWN", (2, 4, 8))
    monkeypatch.setattr(recall, "N_KEYS", 8)
    ctx = tiny_budget
    recall.exp_recall(ctx)
    assert {p.name for p in ctx.out.glob("*.png")} == {"recall.png", "recall_state.png", "recall_attention.png"}
    rows = {r["measure"]: r for r in ctx.rows}
    accuracy = next(r for m, r in rows.items() if m.startswith("MQAR accuracy % at 2 / 4 / 8 pairs"))
    assert all(len(accuracy[name].split(" / ")) == 3 for name in ("gpt", "lstm"))
    assert "chance (1/pairs) 50.0 / 25.0 / 12.5" in accuracy["note"]
    assert any(m.startswith("narrowest width") for m in rows)
    # the grid: 2 lrs at each reference width (more where an end won), the chosen one again with seed 1, each other
    # width with both seeds
    runs = {(p["model"], p["setting"], p["lr"], p["seed"]) for p in ctx.grid}
    assert len(runs) >= 2 * (2 + 1 + 2) and len(ctx.grid) == len(runs) * (1 + 3 + 1)  # selection, 3 tests, capped
    assert {s for m, s, _, _ in runs if m == "gpt"} == {"width 64", "width 16"}


def test_induction_experiment_end_to_end(tiny_budget):
    ctx = tiny_budget
    recall.exp_induction(ctx)
    assert {p.name for p in ctx.out.glob("*.png")} == {"induction.png"}
    accuracy, attention = ctx.rows
    assert accuracy["experiment"] == attention["experiment"] == "induction" and "lr " in accuracy["note"]
    assert attention["gpt"].count("%") == 2
    assert len({(p["model"], p["lr"], p["seed"]) for p in ctx.grid}) >= 2 * 3  # 2 lrs, the best again, widened


def test_seed_grid_trains_the_grid_then_the_chosen_lr_with_the_other_seeds():
    calls = []

    def fit(lr, seed):
        calls.append((lr, seed))
        return {"lr": lr, "seed": seed, "score": -abs(lr - 2) + seed}

    best, lrs, grid, runs = seed_grid(fit, [1, 2, 3], [0, 1, 2], 1, lambda runs: sum(r["score"] for r in runs))
    assert best == 2 and lrs == [1, 2, 3] and set(grid) == {(1, 0), (2, 0), (3, 0)}
    assert calls == [(1, 0), (2, 0), (3, 0), (2, 1), (2, 2)]  # the grid's own seed-0 run is reused, not retrained
    assert [runs[s]["seed"] for s in (0, 1, 2)] == [0, 1, 2] and runs[0] is grid[2, 0]


def test_seed_grid_widens_past_an_end_that_wins_until_the_best_is_inside():
    def fit(lr, seed):
        return {"lr": lr, "score": -abs(lr - 20)}  # best at 20, beyond the grid's top end 4

    best, lrs, grid, runs = seed_grid(fit, [1, 2, 4], [0, 1], 1, lambda runs: runs[0]["score"])
    assert lrs == [1, 2, 4, 8, 16, 32] and best == 16  # two steps of x2 past 4, then 32 shows 16 is inside
    best, lrs, _, _ = seed_grid(fit, [1, 2, 4], [0], 1, lambda runs: runs[0]["score"], widen=1)
    assert lrs == [1, 2, 4, 8] and best == 8  # out of steps: still at the end, which the caller reports
    best, lrs, _, _ = seed_grid(lambda lr, seed: {"score": -lr}, [0.3, 1, 3], [0], 1, lambda runs: runs[0]["score"])
    assert lrs == [0.0081, 0.027, 0.09, 0.3, 1, 3] and best == 0.0081  # downwards too, x 0.3 a step
