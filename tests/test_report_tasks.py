"""scripts/report/tasks.py: the synthetic batches, equal sizes by one matcher, the bytes of state each model carries,
induction's informed chance, the one training loop and its stopping rule (solved or the cap, nothing else), and each
model tuned on its own optimizers (Muon's muon_lr included) on the selection set."""
import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import optim
from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from model import KVCache
from scripts.report import Context, tasks
from scripts.report.induction import speed_merit
from scripts.report.protocol import Recipe
from scripts.report.tasks import (
    TaskRun,
    induction_batch,
    matched_width,
    mixed_recall_batch,
    recall_batch,
    state_bytes,
    steps_to,
    synthetic_models,
    train_synthetic,
    unseen_chance,
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


@pytest.mark.parametrize("seq_len, min_len", [(8, 2), (12, 3)])
def test_induction_informed_chance_counts_the_unseen_tokens(seq_len, min_len):
    x, y, lengths = induction_batch(400, vocab_size=9, seq_len=seq_len, min_len=min_len,
                                    generator=torch.Generator().manual_seed(0))
    hits, positions = 0.0, 0
    for row, target, S in zip(x.tolist(), y.tolist(), lengths.tolist()):
        for t in (t for t, v in enumerate(target) if v >= 0):  # guess uniformly among the segment's unseen tokens
            left = set(row[:S]) - set(row[S:t + 1])
            assert target[t] in left
            hits, positions = hits + 1 / len(left), positions + 1
    assert unseen_chance(lengths.tolist()) == pytest.approx(hits / positions, rel=1e-12)
    assert unseen_chance([2]) == 1 and unseen_chance([4]) == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert math.isclose(unseen_chance([3, 5]), (1.5 + 25 / 12) / 6)


@pytest.mark.parametrize("vocab_size, n_embd", [(33, 32), (129, 64)])
def test_synthetic_models_have_equal_size(vocab_size, n_embd):
    configs = synthetic_models(vocab_size, 64, n_embd)
    sizes = {name: build_model(cfg).num_params() for name, cfg in configs.items()}
    assert set(configs) == {"gpt", "lstm", "mingru"} and all(cfg.n_layer == 2 for cfg in configs.values())
    assert configs["gpt"].n_embd == n_embd and configs["gpt"].n_head == 1
    assert all(abs(sizes[name] / sizes["gpt"] - 1) < 0.03 for name in ("lstm", "mingru")), sizes


@pytest.mark.parametrize("type, gates, tied", [("lstm", 4, False), ("gru", 3, True), ("lstm", 4, True)])
def test_matched_width_is_the_closest_parameter_count(type, gates, tied):
    cfg = ModelConfig(type=type, vocab_size=50, n_layer=3, tie_weights=tied)
    width = matched_width(cfg, 200_000)

    def count(h):  # each layer: gates x (W_ih, W_hh, b_ih, b_hh); the embedding and an untied head
        return 50 * h * (1 if tied else 2) + 3 * gates * (2 * h * h + 2 * h)

    assert build_model(replace(cfg, n_embd=width)).num_params() == count(width)
    assert abs(count(width) - 200_000) <= min(abs(count(width + 1) - 200_000), abs(count(width - 1) - 200_000))
    flops = matched_width(cfg, 2e6, lambda model: model.flops_per_token())  # any measure that grows with the width
    assert abs(6 * count(flops) - 2e6) <= 6 * (count(flops + 1) - count(flops))


@pytest.mark.parametrize("width, n_head, n_kv_head", [(64, 1, None), (32, 4, 2)])
def test_gpt_state_bytes_are_its_kv_cache(width, n_head, n_kv_head):
    cfg = ModelConfig(vocab_size=20, n_layer=3, n_head=n_head, n_kv_head=n_kv_head, n_embd=width, block_size=192)
    for T in (12, 96, 192):
        assert state_bytes(cfg, T) == KVCache(cfg.architecture(), 1, T, "cpu", torch.float32).nbytes


@pytest.mark.parametrize("type", ["lstm", "gru", "mingru"])
def test_rnn_state_bytes_are_its_state_after_any_length(type):
    cfg = ModelConfig(type=type, vocab_size=20, n_layer=2, n_embd=24, block_size=64)
    model = build_model(cfg)
    for T in (1, 50):
        cache = model.new_cache(1, "cpu", torch.float32)
        model(torch.zeros(1, T, dtype=torch.long), cache=cache)
        assert state_bytes(cfg, T) == cache.nbytes
    assert state_bytes(cfg, 50) == 2 * (2 if type == "lstm" else 1) * 24 * 4  # n_layer x (h, c or h) x n_embd x 4 B


def scripted_evaluate(monkeypatch, scores):
    """train_synthetic's evaluations return scores[i] = (accuracy, loss) at its i-th evaluation."""
    calls = iter(scores)
    monkeypatch.setattr(tasks, "task_scores", lambda model, x, y: next(calls))


TINY = ModelConfig(type="lstm", vocab_size=8, block_size=8, n_layer=1, n_embd=8)


def tiny_batch(it, g):
    return torch.randint(0, 8, (2, 8), generator=g), torch.randint(0, 8, (2, 8), generator=g)


EVALS = {"set": tiny_batch(0, torch.Generator().manual_seed(0))}
R = Recipe("muon", 1e-3, 0.02)


def test_an_unsolved_run_trains_to_the_cap_whatever_its_loss_does(monkeypatch):
    scripted_evaluate(monkeypatch, [(0.1, 1.0)] + [(0.3, 0.9)] * 40)  # a flat loss from step 5 on
    run = train_synthetic(TINY, tiny_batch, 100, R, EVALS, torch.device("cpu"), eval_every=5)
    assert run.steps == 100 and [step for step, _ in run.curve] == list(range(0, 101, 5))
    assert run.select == 0.3 and not run.solved and not run.improving  # flat over the last quarter: not improving
    assert steps_to(run) is None
    # the loss falls 2% over the last quarter (steps 75 -> 100): still improving at the cap
    losses = [1.0] * 16 + [0.99, 0.985, 0.98, 0.98, 0.98]
    scripted_evaluate(monkeypatch, [(0.3, loss) for loss in losses])
    run = train_synthetic(TINY, tiny_batch, 100, R, EVALS, torch.device("cpu"), eval_every=5)
    assert run.steps == 100 and run.improving and not run.solved
    # ... by only 0.5%: not
    scripted_evaluate(monkeypatch, [(0.3, loss) for loss in [1.0] * 16 + [0.995] * 5])
    assert not train_synthetic(TINY, tiny_batch, 100, R, EVALS, torch.device("cpu"), eval_every=5).improving


def test_a_run_that_solves_stops_there_and_its_steps_to_90_and_99_come_from_the_curve(monkeypatch):
    scripted_evaluate(monkeypatch, [(0.5, 1.0), (0.92, 0.7), (0.991, 0.5)])
    run = train_synthetic(TINY, tiny_batch, 100, R, EVALS, torch.device("cpu"), eval_every=5)
    assert run.steps == 10 and run.solved and not run.improving and steps_to(run) == 5 and steps_to(run, 0.99) == 10
    # every eval set must be solved: one at 99% and one short of it keep the run going
    two = {"a": EVALS["set"], "b": EVALS["set"]}
    scripted_evaluate(monkeypatch, [(0.995, 1.0), (0.98, 1.0)] * 3 + [(0.995, 0.5)] * 2)
    run = train_synthetic(TINY, tiny_batch, 100, R, two, torch.device("cpu"), eval_every=5)
    assert run.steps == 15 and run.solved and steps_to(run, 0.9) == 0 and steps_to(run, 0.99) == 15


def test_a_tracked_set_is_in_the_curve_and_the_stop_but_not_in_what_the_run_is_chosen_by(monkeypatch):
    # the selection set at 99% from the second eval; the tracked (test) set only from the third: the run goes on
    scripted_evaluate(monkeypatch, [(0.5, 1.0), (0.2, 9.0), (0.995, 0.5), (0.8, 9.0), (0.995, 0.5), (0.995, 9.0)])
    run = train_synthetic(TINY, tiny_batch, 100, R, EVALS, torch.device("cpu"), eval_every=5,
                          tracked={"test": EVALS["set"]})
    assert run.steps == 10 and run.select == 0.995  # the selection set's accuracy alone
    assert steps_to(run, 0.99, {"set": 0}) == 5 and steps_to(run, 0.99, {"test": 0}) == 10


def test_muon_runs_at_the_given_muon_lr_and_iterates_in_fp32_on_every_cpu(monkeypatch):
    # a CPU with native bf16 would otherwise give the same seeds other results than one without
    monkeypatch.setattr(optim, "native_bf16", lambda device: True)
    made, make = [], tasks.make_optimizer
    monkeypatch.setattr(tasks, "make_optimizer", lambda *args: made.append(make(*args)) or made[-1])
    train_synthetic(TINY, tiny_batch, 2, Recipe("muon", 1e-3, 0.12), EVALS, torch.device("cpu"), eval_every=5)
    _, muon = made[0].optimizers
    assert muon.ns_dtype == torch.float32
    assert muon.param_groups[0]["lr_scale"] == pytest.approx(0.12 / 1e-3)  # follows the schedule, peaking at 0.12


def test_gpt_learns_recall_in_a_short_seeded_run():
    evals = {4: recall_batch(256, 4, n_keys=16, generator=torch.Generator().manual_seed(1))}

    def make(it, g):
        return recall_batch(64, 4, n_keys=16, generator=g)

    gpt = ModelConfig(vocab_size=33, block_size=12, n_layer=2, n_head=1, n_embd=64, tie_weights=False)
    run = train_synthetic(gpt, make, 300, Recipe("muon", 3e-3, 0.02), evals, torch.device("cpu"), stop_at=0.97)
    assert run.curve[-1][1][4] >= 0.95, run.curve


def fake_run(steps_to_90, cap, select=0.5):
    """A TaskRun whose curve reaches 90% at steps_to_90 (None: never, by the cap)."""
    curve = [(0, {"s": 0.0}), (cap, {"s": select})] if steps_to_90 is None else [(0, {"s": 0.0}),
                                                                                 (steps_to_90, {"s": 0.995})]
    return TaskRun(model=None, curve=curve, steps=cap if steps_to_90 is None else steps_to_90, seconds=1.0,
               select=curve[-1][1]["s"], solved=steps_to_90 is not None, improving=False)


def test_each_model_tunes_its_own_optimizer_and_muon_lr_on_the_selection_set(monkeypatch):
    # AdamW is at its best at lr 1e-2 (reaches 90% at step 300); Muon is faster, best at muon_lr 0.5, beyond the
    # grid's top 0.18: the grid widens to 0.54 and 1.62, and Muon wins. The test set prefers AdamW: it must not decide
    trained = []

    def fake_train(cfg, make_batch, cap, recipe, evals, device, seed=0, **options):
        trained.append((recipe.optimizer, recipe.lr, recipe.muon_lr, seed))
        if recipe.optimizer == "adamw":
            steps = 300 + round(100 * abs(math.log(recipe.lr / 1e-2)))
        else:
            steps = 100 + round(50 * abs(math.log(recipe.muon_lr / 0.5)))
        return fake_run(steps, cap)

    monkeypatch.setattr(tasks, "train_synthetic", fake_train)
    monkeypatch.setattr(tasks, "task_scores", lambda model, x, y: (0.0, 0.0))
    ctx = Context("quick", torch.device("cpu"), None)
    b = tasks.Budget(adamw_lrs=(3e-3, 1e-2, 3e-2), muon_lrs=(0.02, 0.06, 0.18), widen=3, steps=1000, eval_every=10,
                     seeds=3, tune_seeds=2)
    select = {"s": (torch.zeros(4, 100), torch.zeros(4, 100))}
    test = {"t": (torch.zeros(1, 2), torch.zeros(1, 2))}
    task = tasks.Task("induction", None, select, test)
    best = tasks.train_best(ctx, task, TINY, "lstm", "width 8", b, speed_merit, (0.9, 0.99))
    assert best.tuned.recipe == Recipe("muon", 1e-2, 0.54) and not best.tuned.edge
    assert best.tuned.lrs == [0.02, 0.06, 0.18, 0.54, 1.62] and set(best.tuned.runs) == {0, 1, 2}
    (adamw,) = best.tuned.others
    assert adamw.recipe == Recipe("adamw", 1e-2) and adamw.lrs == [3e-3, 1e-2, 3e-2]
    assert ("muon", 1e-2, 0.54, 2) in trained and ("adamw", 1e-2, 0.0, 1) in trained  # tune seeds, then the rest
    assert sum(seed == 2 for *_, seed in trained) == 1
    assert "muon muon_lr 0.54 (AdamW part lr 0.01) of 0.02/0.06/0.18/0.54/1.62" in best.recipe_text()
    points = {(p["setting"], p["lr"], p["seed"], p["metric"]): p["value"] for p in ctx.grid}
    assert points["width 8, muon", 0.54, 0, "steps to 90% selection accuracy"] == 100 + round(50 * math.log(0.54 / 0.5))
    assert points["width 8, adamw", 3e-3, 0, "steps to 90% selection accuracy"] == 300 + round(100 * math.log(10 / 3))
