"""What the experiments share: the equal-size models (one size matcher), the synthetic tasks (induction, multi-query
associative recall), the one training loop every in-process run goes through, and the synthetic tasks' tuning
(train_best: protocol.best_recipe on a selection set, then every seed, each run scored once on its test set)."""
import math
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from matplotlib.ticker import NullLocator
from tqdm import tqdm

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig, TrainConfig, compose
from attnlab.optim import get_lr, make_optimizer, set_lr, train_step
from scripts.report.protocol import Recipe, Tuned, best_recipe

VOCAB = 96  # the stdlib corpus's characters: the vocabulary of the experiments on random tokens
MODELS = ("gpt", "lstm", "mingru")
RECURRENT = ("lstm", "mingru")
LABELS = {"gpt": "GPT", "lstm": "LSTM", "mingru": "minGRU"}
COLORS = {"gpt": "C0", "lstm": "C1", "mingru": "C2"}
SEEDS = (0, 1, 2, 3, 4)  # a synthetic task's chosen recipe runs with the first Budget.seeds of these
SOLVED = 0.99  # a synthetic run stops before its cap only once every selection set is at this accuracy
FLAT_SE = 2  # a grid is flat when no run solved and its best selection accuracy beats its worst by under this many s.e.
IMPROVING = 0.01  # "still improving at the cap": the selection loss fell by more than this fraction in the last quarter


@dataclass(frozen=True)
class Budget:
    """What one synthetic task may spend: every model's grids, sets, step cap and seeds."""
    batch: int = 32  # sequences per training step
    adamw_lrs: tuple = (3e-3, 1e-2, 3e-2)  # AdamW's lr grid
    muon_lrs: tuple = (0.02, 0.06, 0.18)  # Muon's muon_lr grid, its AdamW part at AdamW's chosen lr
    widen: int = 1  # points a grid may grow past an end that wins
    selection: int = 96  # sequences per selection set, scored every eval_every steps
    test: int = 256  # sequences per test set, scored once per run (induction: also every eval, never chosen on)
    steps: int = 600  # every run's step cap
    eval_every: int = 20  # steps between selection scores
    seeds: int = 5  # seeds at each model's chosen recipe
    tune_seeds: int = 1  # seeds on which best_recipe compares AdamW's choice with Muon's


# ----- models of equal size -----

def matched_width(cfg, target, measure=lambda model: model.num_params()):
    """The width at which cfg's model comes closest to target by measure (parameters, or training FLOPs per token),
    which grows with the width: a binary search over models built on the meta device (no memory)."""
    def at(width):
        with torch.device("meta"):
            return measure(build_model(replace(cfg, n_embd=width)))
    low, high = 1, 2
    while at(high) < target:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        if at(middle) < target:
            low = middle
        else:
            high = middle
    return min((low, high), key=lambda width: abs(at(width) - target))


def matched(gpt, names=RECURRENT, **rnn):
    """gpt's ModelConfig and, for each of names, the recurrent model of gpt's parameter count; rnn: fields of the
    recurrent models that differ from gpt's (n_layer, tie_weights)."""
    with torch.device("meta"):
        params = build_model(gpt).num_params()
    configs = {"gpt": gpt}
    for name in names:
        cfg = replace(gpt, type=name, **rnn)
        configs[name] = replace(cfg, n_embd=matched_width(cfg, params))
    return configs


def lstm_preset(vocab_size):
    """configs/model/lstm.yaml, the LSTM that matches the default GPT's parameter count."""
    return replace(compose("model=lstm").model, vocab_size=vocab_size)


def synthetic_models(vocab_size, seq_len, n_embd=64):
    """A 2-layer GPT of width n_embd, one head, an untied head (the 4-head and tied variants stay far longer on the
    chance plateau: docs/log.md), and the LSTM and minGRU of its parameter count."""
    return matched(ModelConfig(vocab_size=vocab_size, block_size=seq_len, n_layer=2, n_head=1, n_embd=n_embd,
                               tie_weights=False))


def state_bytes(cfg, seq_len):
    """Bytes of state a model carries per sequence after seq_len tokens, in fp32: a GPT's KV cache (K and V of every
    layer and token), an LSTM's h and c of every layer, a minGRU's h of every layer; a recurrent state does not grow
    with seq_len."""
    arch = cfg.architecture()
    if cfg.type == "gpt":
        return 2 * arch.n_layer * arch.kv_heads * arch.head_size * seq_len * 4
    return arch.n_layer * (2 if cfg.type == "lstm" else 1) * arch.n_embd * 4


# ----- the synthetic tasks -----

def recall_batch(batch_size, n_pairs, n_keys=64, seq_len=None, generator=None):
    """Multi-query associative recall (Zoology; Arora et al. 2023): n_pairs key-value pairs (distinct keys, distinct
    values), then every key once more in random order, then filler up to seq_len (default 3 * n_pairs: none). The
    target at each query is its key's value; -1 elsewhere. Tokens: 0 filler, 1..n_keys keys, n_keys+1..2*n_keys
    values, so a guess among the values present scores 1/n_pairs. Returns inputs and targets, each (B, seq_len)."""
    seq_len = seq_len or 3 * n_pairs
    if not 0 < n_pairs <= n_keys or 3 * n_pairs > seq_len:
        raise ValueError(f"{n_pairs} pairs need n_keys >= {n_pairs} and seq_len >= {3 * n_pairs}")
    def draw():
        return torch.rand(batch_size, n_keys, generator=generator).argsort(1)[:, :n_pairs] + 1  # distinct
    keys, values = draw(), draw() + n_keys
    x = torch.zeros(batch_size, seq_len, dtype=torch.long)
    x[:, 0:2 * n_pairs:2], x[:, 1:2 * n_pairs:2] = keys, values
    order = torch.rand(batch_size, n_pairs, generator=generator).argsort(1)
    x[:, 2 * n_pairs:3 * n_pairs] = keys.gather(1, order)
    y = torch.full_like(x, -1)
    y[:, 2 * n_pairs:3 * n_pairs] = values.gather(1, order)
    return x, y


def mixed_recall_batch(batch_size, fewest, most, n_keys=64, generator=None):
    """A recall batch whose number of pairs is drawn log-uniformly from fewest..most: as many batches with 4-8 pairs
    as with 32-64, so the short ones, where the look-up forms first, teach every model alike (no curriculum)."""
    n = round(2 ** (math.log2(fewest) + torch.rand(1, generator=generator).item() * math.log2(most / fewest)))
    return recall_batch(batch_size, n, n_keys, generator=generator)


def induction_batch(batch_size, vocab_size=33, seq_len=64, min_len=8, generator=None):
    """A segment of min_len..seq_len/2 distinct random tokens (1..vocab_size-1), repeated, then filler 0s. Targets:
    the next token inside the second copy (-1 elsewhere), which only a look-back at the first copy predicts; the
    random length rules out a fixed-offset shortcut. Returns inputs, targets (B, seq_len), segment lengths (B,)."""
    half = seq_len // 2
    lengths = torch.randint(min_len, half + 1, (batch_size, 1), generator=generator)  # (B, 1)
    segment = torch.rand(batch_size, vocab_size - 1, generator=generator).argsort(1)[:, :half] + 1  # (B, half)
    t = torch.arange(seq_len)[None]  # (1, T)
    x = torch.where(t < 2 * lengths, segment.gather(1, (t % lengths).clamp(max=half - 1)), 0)
    y = torch.cat([x[:, 1:], torch.full((batch_size, 1), -1)], dim=1)
    y[(t < lengths) | (t >= 2 * lengths - 1)] = -1
    return x, y, lengths[:, 0]


def unseen_chance(lengths):
    """Induction's informed chance: the accuracy on the second copy of a model that knows the segment's tokens but not
    their order, guessing uniformly among those not yet seen in the second copy: a copy of S tokens scores H(S-1)
    hits out of S-1, pooled over the sequences of lengths."""
    hits = sum(sum(1 / k for k in range(1, S)) for S in lengths)
    return hits / sum(S - 1 for S in lengths)


def seeded(seed):
    return torch.Generator().manual_seed(seed)


# ----- the training loop -----

def train_config(recipe, steps, warmup, dtype="float32"):
    """train.py's optimizer settings for recipe: warmup, then cosine to lr/10 at the cap. train_loop never autocasts;
    dtype sets Muon's iterations only (auto: bf16 where the CPU computes it natively)."""
    return TrainConfig(optimizer=recipe.optimizer, learning_rate=recipe.lr, min_lr=recipe.lr / 10,
                       muon_lr=recipe.muon_lr, max_iters=steps, warmup_iters=warmup, dtype=dtype)


def train_loop(model_cfg, train_cfg, make_batch, device, seed, data_seed, evaluate=None, every=1, desc="train"):
    """A fresh model of model_cfg (seed) trained by train.py's optimizers, schedule and clipping for train_cfg's
    max_iters steps on batches make_batch(step, generator) (data_seed). evaluate(step, model) runs every `every`
    steps and at the cap; training stops early where it returns True. Returns the model and the steps taken."""
    torch.manual_seed(seed)
    model = build_model(model_cfg).to(device)
    optimizer = make_optimizer(model, train_cfg, device)
    generator, steps = torch.Generator().manual_seed(data_seed), train_cfg.max_iters
    for it in tqdm(range(steps + 1), desc=desc, leave=False):
        if evaluate and (it % every == 0 or it == steps) and evaluate(it, model):
            break
        if it == steps:
            break
        set_lr(optimizer, get_lr(it, train_cfg))
        x, y = make_batch(it, generator)
        train_step(model, optimizer, [(x.to(device), y.to(device))], grad_clip=train_cfg.grad_clip)
    return model.eval(), it


@torch.no_grad()
def task_scores(model, x, y):
    """Accuracy and mean cross-entropy over the scored positions (targets >= 0)."""
    model.eval()
    logits = model(x)[0][y >= 0]  # (scored positions, vocab)
    model.train()
    return (logits.argmax(-1) == y[y >= 0]).float().mean().item(), F.cross_entropy(logits, y[y >= 0]).item()


@dataclass
class TaskRun:
    """One trained configuration: the model as training left it, the curve [(step, {eval set: accuracy})], the steps
    and seconds it took, its mean accuracy over the sets it is chosen on at the end, whether it reached SOLVED on
    every set, whether it was still improving when the cap stopped it, and its test accuracies (filled after)."""
    model: torch.nn.Module
    curve: list
    steps: int
    seconds: float
    select: float
    solved: bool
    improving: bool
    test: dict = field(default_factory=dict)
    chosen_on: tuple = ()  # the eval sets select averages (empty: every set in the curve)


def steps_to(run, level=0.9, sets=None):
    """The first scored step at which every one of sets (default: those the run is chosen on) reached level; None if
    it never did."""
    sets = sets or run.chosen_on
    return next((step for step, accs in run.curve
                 if min(v for k, v in accs.items() if not sets or k in sets) >= level), None)


def still_improving(losses, steps):
    """losses [(step, summed selection loss)]: did the loss fall by more than IMPROVING over the last quarter?"""
    before = [loss for step, loss in losses if step <= 3 * steps / 4][-1]
    return losses[-1][1] < (1 - IMPROVING) * before


def train_synthetic(model_cfg, make_batch, steps, recipe, evals, device, stop_at=SOLVED, eval_every=50, seed=0,
                    desc="train", tracked=None):
    """train_loop on freshly drawn batches, scoring the eval sets and the tracked ones (a test set whose curve is
    reported, never chosen on) every eval_every steps; it stops early only once every one is at stop_at, so every
    unsolved run gets the whole cap, whatever its model. At the cap it records whether the summed selection loss was
    still falling (still_improving)."""
    chosen_on = list(evals)
    scored_sets = {name: (x.to(device), y.to(device)) for name, (x, y) in {**evals, **(tracked or {})}.items()}
    curve, losses, start = [], [], time.time()

    def evaluate(it, model):
        scored = {name: task_scores(model, x, y) for name, (x, y) in scored_sets.items()}
        curve.append((it, {name: acc for name, (acc, _) in scored.items()}))
        losses.append((it, sum(scored[name][1] for name in chosen_on)))
        return min(curve[-1][1].values()) >= stop_at

    train_cfg = train_config(recipe, steps, min(50, steps // 10))
    model, it = train_loop(model_cfg, train_cfg, make_batch, device, seed, seed + 1, evaluate, eval_every, desc)
    solved = min(curve[-1][1].values()) >= stop_at
    select = sum(curve[-1][1][name] for name in chosen_on) / len(chosen_on)
    improving = not solved and still_improving(losses, steps)
    return TaskRun(model, curve, it, time.time() - start, select, solved, improving, chosen_on=tuple(chosen_on))


# ----- a synthetic task's tuning -----

@dataclass
class Task:
    """A synthetic task as train_best trains on it: its experiment's name, make_batch(step, generator) -> (x, y), and
    its selection and test sets {name: (x, y)}."""
    experiment: str
    make_batch: Callable
    selection: dict
    test: dict
    tracked: bool = False  # the test sets scored at every eval too (their curve read, never chosen on)


@dataclass
class Trained:
    """One model tuned on one task (protocol.best_recipe), its chosen recipe run with every seed."""
    name: str
    cfg: ModelConfig
    tuned: Tuned
    seconds: float  # every run of its grids and seeds, together

    @property
    def runs(self) -> list[TaskRun]:
        return self.tuned.by_seed

    def recipe_text(self):
        """The chosen recipe, and where it sits in its grid."""
        where = " (at the grid's edge)" if self.tuned.edge else " (flat grid)" if self.tuned.flat else ""
        return f"{self.tuned.recipe} of {'/'.join(f'{lr:g}' for lr in self.tuned.lrs)}{where}"


def flat_test(select):
    """A grid is flat when no run solved and its best selection accuracy is within FLAT_SE standard errors of its
    worst: every lr scores alike (at chance, say), so an end that wins is noise and widening would chase it."""
    scored = sum(int((y >= 0).sum()) for _, y in select.values()) / len(select)  # scored positions per set

    def flat(runs):
        best, worst = max(run.select for run in runs), min(run.select for run in runs)
        return not any(run.solved for run in runs) and best - worst < FLAT_SE * math.sqrt(best * (1 - best) / scored)
    return flat


def tested(test):
    """The test sets under the names their curves carry."""
    return {f"test: {key}": xy for key, xy in test.items()}


def train_best(ctx, task, cfg, name, setting, b, merit, levels):
    """cfg at its best recipe (best_recipe on b's grids, choosing by merit on the selection sets), then the chosen
    recipe with the rest of b's seeds. Every run goes to ctx.grid_point: its selection and test accuracies, its steps
    to each of levels and whether it was still improving at the cap."""
    seconds = []

    def fit(recipe: Recipe, seed):
        label = f"{task.experiment} {name} {setting} {recipe} seed {seed}"
        run = train_synthetic(cfg, task.make_batch, b.steps, recipe, task.selection, ctx.device,
                              eval_every=b.eval_every, seed=seed, desc=label,
                              tracked=tested(task.test) if task.tracked else None)
        run.test = {key: task_scores(run.model, x.to(ctx.device), y.to(ctx.device))[0]
                    for key, (x, y) in task.test.items()}
        seconds.append(run.seconds)
        tqdm.write(f"{label}: {run.steps} steps in {run.seconds:.0f} s, selection {100 * run.select:.1f}%")
        splits = {"selection": task.selection, **({"test": tested(task.test)} if task.tracked else {})}
        measured = [("selection accuracy", round(run.select, 4)),
                    *((f"test accuracy {key}", round(acc, 4)) for key, acc in run.test.items()),
                    *((f"steps to {100 * level:g}% {split} accuracy", reached_text(steps_to(run, level, sets)))
                      for level in levels for split, sets in splits.items()),
                    ("still improving at the cap (1 = yes)", int(run.improving))]
        for metric, value in measured:
            ctx.grid_point(task.experiment, name, f"{setting}, {recipe.optimizer}", recipe.grid_lr, seed, run.steps,
                           run.seconds, metric, value)
        return run

    tuned = best_recipe(fit, b.adamw_lrs, b.muon_lrs, SEEDS[:b.tune_seeds], merit, flat=flat_test(task.selection),
                        widen=b.widen)
    for seed in SEEDS[b.tune_seeds:b.seeds]:
        tuned.runs[seed] = fit(tuned.recipe, seed)
    return Trained(name, cfg, tuned, sum(seconds))


def reached_text(step):
    return "not reached" if step is None else step


def percent_range(values, digits=0):
    """Percentages over seeds as 'min-max', or one number when they agree to the last digit shown."""
    low, high = f"{100 * min(values):.{digits}f}", f"{100 * max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def protocol_text(b):
    """A synthetic task's budget in one line, for its figures."""
    return (f"batch {b.batch}, cap {b.steps} steps, scored every {b.eval_every}; AdamW lr "
            f"{'/'.join(map(str, b.adamw_lrs))} then Muon muon_lr {'/'.join(map(str, b.muon_lrs))} on seed 0 "
            f"(widened up to {b.widen}), then seeds {', '.join(map(str, SEEDS[:b.seeds]))}")


def length_axis(ax, lengths, label):
    """A log x axis ticked at the lengths measured, in plain numbers."""
    ax.set_xlabel(label)
    ax.set_xticks(lengths, [f"{T:,}" for T in lengths])
    ax.xaxis.set_minor_locator(NullLocator())


def save_wrapped(ctx, fig, name, detail):
    """ctx.save with the detail wrapped to the figure's width, so a long line does not widen the PNG."""
    ctx.save(fig, name, textwrap.fill(detail, int(20 * fig.get_figwidth())))
