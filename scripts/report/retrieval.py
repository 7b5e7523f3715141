"""Reason (c), content-based retrieval: can a model find a token by what it is, anywhere in its context?

    induction  a random segment repeated: the steps each model needs to copy it back (90% and 99% of the second
               copy right on the test set, scored along the way, which chooses nothing), every seed at each model's
               best recipe; the verdict reads the ratio of steps, which a capped run bounds from below (the cap over
               the GPT's steps), not the accuracy where the cap happens to stop it
    mqar       multi-query associative recall (Zoology; Arora et al. 2023) at 4-32 key-value pairs: test accuracy
               against the number of pairs at a few widths, and against each model's bytes of state (a GPT's KV cache
               grows with the tokens it read, a recurrent state does not)

Three models: a GPT (attention), an LSTM (a recurrence nonlinear in its state, read one step at a time) and a minGRU
(Feng et al. 2024: a recurrence linear in its state, read in parallel by a scan). A minGRU that fails where the LSTM
fails puts the failure on the fixed state, reason (c), rather than on sequential training, reason (a).

Every model is tuned alike, through protocol.best_recipe: AdamW's lr grid, then Muon's muon_lr grid, every grid point
on seed 0, the choice made on a selection set; the chosen recipe then runs with every seed, and each run reads its
test set once, after training. Equal step cap, batch and schedule for all; a run stops early only once it solves the
task (SOLVED on every selection set). Each rule below is written before the runs and applied by the code.
"""
import math
import statistics
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import NullFormatter
from tqdm import tqdm

from attnlab.config import ModelConfig
from scripts.report.protocol import Recipe, Tuned, best_recipe, ratio_range
from scripts.report.tasks import (
    TaskRun,
    induction_batch,
    mixed_recall_batch,
    recall_batch,
    state_bytes,
    steps_to,
    synthetic_models,
    task_scores,
    train_synthetic,
    unseen_chance,
)

MODELS = ("gpt", "lstm", "mingru")
RECURRENT = ("lstm", "mingru")
LABELS = {"gpt": "GPT", "lstm": "LSTM", "mingru": "minGRU"}
COLORS = {"gpt": "C0", "lstm": "C1", "mingru": "C2"}
SEEDS = (0, 1, 2, 3, 4)  # the chosen recipe runs with the first BUDGET[...]["seeds"] of these
SOLVED = 0.99  # a run stops before its cap only once every selection set is at this accuracy
LEVELS = (0.9, 0.99)  # induction: steps to these selection accuracies
SPEEDUP = 2  # induction: the factor by which a recurrent model must be slower over every seed pairing
LEVEL = 0.9  # mqar: a width solves a pair count when every seed's test accuracy reaches this
FLAT_SE = 2  # a grid is flat when no run solved and its best selection accuracy beats its worst by under this many s.e.

RULE_INDUCTION = (
    "steps to 90% test accuracy on the second copy (the test set scored every eval step, never chosen on), each model "
    "at its best recipe, over every pairing of a GPT seed with a recurrent seed; a run that never reaches 90% counts "
    "at the cap, so a ratio against it is a lower bound (the cap over the GPT's steps). Shown here if every GPT seed "
    "reaches 99% and, for the LSTM and for the minGRU, every pairing's ratio "
    "(recurrent / GPT) exceeds 2; contradicted here if, for the LSTM or the minGRU, every seed reaches 90% and every "
    "pairing's ratio is at most 1; otherwise not shown here")
RULE_MQAR = (
    "a width solves a pair count when every seed's test accuracy there is >= 90%, and fails it when every seed's is "
    "below. For the LSTM and for the minGRU: shown if at some pair count the GPT's narrowest width solves and every "
    "recurrent width fails, while a recurrent width solves the fewest pairs (the failure comes with the pairs, not "
    "from never learning the task); contradicted if at the most pairs any GPT solves, a recurrent width with no more "
    "bytes of state than that GPT's KV cache solves too. Shown here if shown for both, contradicted here if for "
    "either, otherwise not shown here")

BUDGET = {
    "quick": dict(
        batch=32,  # sequences per training step
        adamw_lrs=(3e-3, 1e-2, 3e-2),  # AdamW's lr grid
        muon_lrs=(0.02, 0.06, 0.18),  # Muon's muon_lr grid, its AdamW part at AdamW's chosen lr
        widen=1,  # points a grid may grow past an end that wins
        selection=96,  # sequences per selection set (mqar: per pair count), scored every eval_every steps
        test=256,  # sequences per test set (mqar: per pair count), scored once per run
        induction=dict(
            n_embd=32,  # the GPT's width; the LSTM and the minGRU match its parameter count
            steps=600,  # every run's step cap: past twice the GPT's steps to 90% at every GPT grid point
            eval_every=20,  # steps between selection scores: the resolution of steps to 90% / 99%
            seeds=5,  # seeds at each model's chosen recipe
            tune_seeds=1,  # seeds on which best_recipe compares AdamW's choice with Muon's
        ),
        mqar=dict(
            pairs=(4, 8, 16),  # trained as a log-uniform mix of these counts, tested at each
            keys=16,  # distinct keys (and values): at least the most pairs; fewer keys leave the chance plateau sooner
            widths=dict(gpt=(32,), lstm=(64,), mingru=(64,)),  # each model's widths (2 layers, the GPT 1 head)
            steps=500,  # every run's step cap
            eval_every=50,  # steps between selection scores
            seeds=3,  # seeds at each width's chosen recipe
            tune_seeds=1,  # seeds on which best_recipe compares AdamW's choice with Muon's
        ),
    ),
    "full": dict(
        batch=32,  # sequences per training step
        adamw_lrs=(3e-3, 1e-2, 3e-2),  # AdamW's lr grid
        muon_lrs=(0.02, 0.06, 0.18),  # Muon's muon_lr grid, its AdamW part at AdamW's chosen lr
        widen=2,  # points a grid may grow past an end that wins
        selection=192,  # sequences per selection set (mqar: per pair count)
        test=512,  # sequences per test set (mqar: per pair count)
        induction=dict(
            n_embd=32,  # the GPT's width; the LSTM and the minGRU match its parameter count
            steps=1000,  # every run's step cap: the rule needs it past twice the GPT's steps to 90%
            eval_every=20,  # steps between selection scores
            seeds=5,  # seeds at each model's chosen recipe
            tune_seeds=1,  # seeds on which best_recipe compares AdamW's choice with Muon's
        ),
        mqar=dict(
            pairs=(4, 8, 16, 32),  # trained as a log-uniform mix of these counts, tested at each
            keys=32,  # distinct keys (and values): at least the most pairs
            widths=dict(gpt=(32, 64), lstm=(64, 128), mingru=(64, 128)),  # each model's widths
            steps=1000,  # every run's step cap
            eval_every=50,  # steps between selection scores
            seeds=3,  # seeds at each width's chosen recipe
            tune_seeds=1,  # seeds on which best_recipe compares AdamW's choice with Muon's
        ),
    ),
}


def seeded(seed):
    return torch.Generator().manual_seed(seed)


def save_wrapped(ctx, fig, name, detail):
    """ctx.save with the detail wrapped to the figure's width, so a long protocol line does not widen the PNG."""
    ctx.save(fig, name, textwrap.fill(detail, int(20 * fig.get_figwidth())))


def percent_range(values, digits=0):
    """Percentages over seeds as 'min-max', or one number when they agree to the last digit shown."""
    low, high = f"{100 * min(values):.{digits}f}", f"{100 * max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


@dataclass
class Trained:
    """One model tuned on one task (protocol.best_recipe), its chosen recipe run with every seed."""
    name: str
    cfg: ModelConfig
    tuned: Tuned
    seconds: float  # every run of its grids and seeds, together

    @property
    def runs(self) -> list[TaskRun]:
        return [self.tuned.runs[seed] for seed in sorted(self.tuned.runs)]

    def recipe_text(self):
        """The chosen recipe, and where it sits in its grid."""
        where = " (at the grid's edge)" if self.tuned.edge else " (flat grid)" if self.tuned.flat else ""
        lrs = "/".join(f"{lr:g}" for lr in self.tuned.lrs)
        return f"{self.tuned.recipe} of {lrs}{where}"


def flat_test(select):
    """A grid is flat when no run solved and its best selection accuracy is within FLAT_SE standard errors of its
    worst: every lr scores alike (at chance, say), so an end that wins is noise and widening would chase it."""
    scored = sum(int((y >= 0).sum()) for _, y in select.values()) / len(select)  # scored positions per set

    def flat(runs):
        best, worst = max(run.select for run in runs), min(run.select for run in runs)
        return not any(run.solved for run in runs) and best - worst < FLAT_SE * math.sqrt(best * (1 - best) / scored)
    return flat


@dataclass
class Task:
    """A synthetic task as train_best trains on it: its experiment's name, make_batch(step, generator) -> (x, y), and
    its selection and test sets {name: (x, y)}."""
    experiment: str
    make_batch: Callable
    selection: dict
    test: dict
    tracked: bool = False  # the test sets scored at every eval too (their curve read, never chosen on)


def train_best(ctx, task, cfg, name, setting, b, part, merit):
    """cfg at its best recipe (best_recipe on b's grids, choosing by merit on the selection sets), then the chosen
    recipe with the rest of part's seeds. Every run goes to ctx.grid_point: its selection and test accuracies, its
    steps to each of LEVELS and whether it was still improving at the cap."""
    experiment, make_batch, select, test = task.experiment, task.make_batch, task.selection, task.test
    seconds = []

    def fit(recipe: Recipe, seed):
        label = f"{experiment} {name} {setting} {recipe} seed {seed}"
        run = train_synthetic(cfg, make_batch, part["steps"], recipe.lr, select, ctx.device, stop_at=SOLVED,
                              eval_every=part["eval_every"], seed=seed, desc=label, optimizer=recipe.optimizer,
                              muon_lr=recipe.muon_lr, tracked=tested(test) if task.tracked else None)
        run.test = {key: task_scores(run.model, x.to(ctx.device), y.to(ctx.device))[0] for key, (x, y) in test.items()}
        seconds.append(run.seconds)
        tqdm.write(f"{label}: {run.steps} steps in {run.seconds:.0f} s, selection {100 * run.select:.1f}%")
        measured = [("selection accuracy", round(run.select, 4)),
                    *((f"test accuracy {key}", round(acc, 4)) for key, acc in run.test.items()),
                    *((f"steps to {100 * level:g}% {split} accuracy", reached_text(steps_to(run, level, sets)))
                      for level in LEVELS for split, sets in (("selection", select), ("test", tested(test)))
                      if split == "selection" or task.tracked),
                    ("still improving at the cap (1 = yes)", int(run.improving))]
        for metric, value in measured:
            ctx.grid_point(experiment, name, f"{setting}, {recipe.optimizer}", recipe.grid_lr, seed, run.steps,
                           run.seconds, metric, value)
        return run

    tuned = best_recipe(fit, b["adamw_lrs"], b["muon_lrs"], SEEDS[:part["tune_seeds"]], 1, merit,
                        flat=flat_test(select), widen=b["widen"])
    for seed in SEEDS[part["tune_seeds"]:part["seeds"]]:
        tuned.runs[seed] = fit(tuned.recipe, seed)
    return Trained(name, cfg, tuned, sum(seconds))


def tested(test):
    """The test sets under the names their curves carry."""
    return {f"test: {key}": xy for key, xy in test.items()}


def reached_text(step):
    return "not reached" if step is None else step


# ----- induction: learning speed -----

@dataclass
class Speed:
    """Steps to one selection accuracy, one entry per seed; None where the run never reached it by the cap."""
    steps: list
    cap: int

    @property
    def bounded(self):
        """The steps with a run that never reached counted at the cap: a lower bound on its true steps."""
        return [step if step is not None else self.cap for step in self.steps]

    @property
    def reached(self):
        return all(step is not None for step in self.steps)

    def text(self):
        return " / ".join(str(step) if step is not None else f">{self.cap}" for step in self.steps)


def speed_merit(runs):
    """Induction's choice on the selection set: the most seeds at 90%, then the fewest steps to it (a run that never
    reaches counted at its cap), then the best selection accuracy."""
    steps = [steps_to(run, LEVELS[0]) for run in runs]
    bounded = [step if step is not None else run.steps for step, run in zip(steps, runs)]
    return sum(step is not None for step in steps), -sum(bounded), sum(run.select for run in runs)


def speed_status(gpt90: Speed, gpt99: Speed, other90: Speed):
    """RULE_INDUCTION for one recurrent model against the GPT."""
    ratios = [r / g for r in other90.bounded for g in gpt90.bounded]
    if gpt99.reached and min(ratios) > SPEEDUP:
        return "shown here"
    if other90.reached and max(ratios) <= 1:
        return "contradicted here"
    return "not shown here"


def combined(statuses):
    """Both recurrent models' statuses as one: shown if every one shows, contradicted if any contradicts."""
    if "contradicted here" in statuses:
        return "contradicted here"
    return "shown here" if all(s == "shown here" for s in statuses) else "not shown here"


def ratio_text(other: Speed, gpt: Speed):
    """The median ratio of steps and its range over every seed pairing, saying when it is a lower bound (a recurrent
    seed capped) or no bound at all (a GPT seed capped too)."""
    missed, gpt_missed = (sum(step is None for step in speed.steps) for speed in (other, gpt))
    if gpt_missed:
        return (ratio_range(other.bounded, gpt.bounded) + f", no bound: {gpt_missed} of {len(gpt.steps)} GPT seeds "
                f"not there by {gpt.cap}")
    bound = (f", a lower bound, the cap {other.cap} over the GPT's steps: {missed} of {len(other.steps)} seeds not "
             f"there by the cap" if missed else "")
    return ratio_range(other.bounded, gpt.bounded) + bound


def induction_verdict(speeds):
    """(evidence, status) by RULE_INDUCTION from speeds {model: {level: Speed}} (the GPT and its recurrent rivals)."""
    gpt = speeds["gpt"]
    rivals = [name for name in RECURRENT if name in speeds]
    statuses = [speed_status(gpt[LEVELS[0]], gpt[LEVELS[1]], speeds[name][LEVELS[0]]) for name in rivals]
    evidence = (f"steps to 90%: GPT {gpt[LEVELS[0]].text()}; " + "; ".join(
        f"{LABELS[name]} {speeds[name][LEVELS[0]].text()}, ratio to the GPT "
        f"{ratio_text(speeds[name][LEVELS[0]], gpt[LEVELS[0]])} ({status})" for name, status in zip(rivals, statuses))
        + f"; GPT steps to 99%: {gpt[LEVELS[1]].text()}")
    return evidence, combined(statuses)


def exp_induction(ctx):
    """A random segment repeated: copying it back needs a look-up by content (a previous-token head and an induction
    head, Olsson et al. 2022). Every model at equal parameter count and at its best recipe."""
    b = BUDGET[ctx.preset]
    part = b["induction"]
    configs = synthetic_models(33, 64, part["n_embd"])
    select = {"second copy": induction_batch(b["selection"], generator=seeded(300))[:2]}
    *test_set, test_lengths = induction_batch(b["test"], generator=seeded(400))
    test = {"second copy": test_set}
    chance = {"uniform over the 32 tokens": 1 / 32,  # filler 0 is never a target
              "uniform over the segment's tokens not yet seen in the second copy": unseen_chance(test_lengths.tolist())}

    def make(it, g):
        return induction_batch(b["batch"], generator=g)[:2]

    task = Task("induction", make, select, test, tracked=True)
    trained = {name: train_best(ctx, task, cfg, name, f"width {cfg.n_embd}", b, part, speed_merit)
               for name, cfg in configs.items()}
    speeds = {name: {level: Speed([steps_to(run, level, tested(test)) for run in t.runs], part["steps"])
                     for level in LEVELS} for name, t in trained.items()}
    n_params = {name: t.runs[0].model.num_params() for name, t in trained.items()}
    prev, induct = induction_figure(ctx, trained, speeds, chance, part, (
        "2-layer GPT (1 head), LSTM and minGRU of equal size (" + ", ".join(
            f"{LABELS[n]} width {configs[n].n_embd}, {n_params[n]:,} params" for n in MODELS) + "); segments of 8-32 "
        "distinct tokens out of 32; " + protocol_text(b, part) + "; chosen: " + "; ".join(
            f"{LABELS[n]} {t.recipe_text()}" for n, t in trained.items())))
    for level in LEVELS:
        ctx.row("induction", f"steps to {100 * level:g}% test accuracy on the second copy, per seed "
                "(>cap: not reached)", speeds["gpt"][level].text(), speeds["lstm"][level].text(),
                "ratio to the GPT (median, range over seed pairings): " + "; ".join(
                    f"{LABELS[n]} {ratio_text(speeds[n][level], speeds['gpt'][level])}" for n in RECURRENT)
                + f"; eval every {part['eval_every']} steps, cap {part['steps']}",
                speeds["mingru"][level].text())
    accuracy = {name: [run.test["second copy"] for run in t.runs] for name, t in trained.items()}
    ctx.row("induction", f"test accuracy % on the second copy at the end (min-max over {part['seeds']} seeds)",
            *(percent_range(accuracy[n], 1) for n in ("gpt", "lstm")),
            "chance " + ", ".join(f"{label} {100 * level:.1f}%" for label, level in chance.items()) + "; recipes: "
            + "; ".join(f"{LABELS[n]} {t.recipe_text()}" for n, t in trained.items()) + "; training "
            + " / ".join(f"{t.seconds:.0f} s" for t in trained.values()) + " (every run, GPT / LSTM / minGRU)",
            percent_range(accuracy["mingru"], 1))
    ctx.row("induction", "GPT attention: layer 1 on the previous token / layer 2 on the induction target",
            f"{100 * prev:.0f}% / {100 * induct:.0f}%", "", "seed 0, averaged over the second copy of 256 sequences")
    ctx.verdict("induction", "c", *induction_verdict(speeds), rule=RULE_INDUCTION)


def protocol_text(b, part):
    """The training and selection protocol in one sentence, for the figures' detail lines."""
    return (f"every model: batch {b['batch']}, cap {part['steps']} steps (warmup + cosine to the cap), scored every "
            f"{part['eval_every']}, stopped early only at {100 * SOLVED:g}% on every selection set; recipe chosen on "
            f"the selection set over AdamW lr {'/'.join(map(str, b['adamw_lrs']))} then Muon muon_lr "
            f"{'/'.join(map(str, b['muon_lrs']))} (seed 0 per point, up to {b['widen']} more past a winning end "
            f"unless flat), then "
            f"run with seeds {', '.join(map(str, SEEDS[:part['seeds']]))}; test set read once per run")


def induction_figure(ctx, trained, speeds, chance, part, detail):
    """Learning curves, steps to each level per seed, and the GPT's two attention layers; returns the GPT's mean
    attention on the previous token (layer 1) and on the induction target (layer 2)."""
    x, _, lengths = induction_batch(256, generator=seeded(500))
    maps = trained["gpt"].runs[0].model.attention_maps(x.to(ctx.device))
    rows = []  # per sequence: second-copy positions t, the positions before them, and after the earlier copy
    for i, S in enumerate(lengths.tolist()):
        t = torch.arange(S, 2 * S - 1)  # the scored positions: inside the second copy
        rows.append((i, t, t - 1, t - S + 1))
    prev = sum(maps[0][i, 0, t, p].mean().item() for i, t, p, _ in rows) / len(rows)
    induct = sum(maps[1][i, 0, t, s].mean().item() for i, t, _, s in rows) / len(rows)
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.5))
    for name, t in trained.items():
        for seed, run in enumerate(t.runs):
            axes[0].plot([s for s, _ in run.curve], [100 * a["second copy"] for _, a in run.curve],
                         color=COLORS[name], alpha=1 if seed == 0 else 0.4, label=LABELS[name] if seed == 0 else None)
    for (label, level), style in zip(chance.items(), (":", "--")):
        axes[0].axhline(100 * level, color="k", ls=style, lw=0.7, label=f"chance: {label}")
    axes[0].set(xlabel="training step", ylabel="selection accuracy on the second copy (%)", ylim=(0, 102),
                title="learning curves\n(faint: the seeds after 0)")
    axes[0].legend(fontsize=6, loc="upper right")
    for col, name in enumerate(MODELS):
        for level, marker in zip(LEVELS, ("o", "s")):
            speed = speeds[name][level]
            reached = [s for s in speed.steps if s is not None]
            axes[1].plot([col + (0.15 if marker == "s" else -0.15)] * len(reached), reached, marker,
                         color=COLORS[name], mfc="none" if marker == "s" else COLORS[name], alpha=0.7)
            missed = len(speed.steps) - len(reached)
            axes[1].plot([col + (0.15 if marker == "s" else -0.15)] * missed, [1.05 * part["steps"]] * missed, "x",
                         color=COLORS[name])
    axes[1].axhline(part["steps"], color="gray", ls="--", lw=0.6)
    axes[1].set_xticks(range(len(MODELS)), [LABELS[n] for n in MODELS])
    axes[1].set(ylabel="steps", ylim=(0, 1.1 * part["steps"]), title="steps to 90% (filled) and 99% (open) per seed\n"
                "(x: not reached by the cap, dashed)")
    example = int((lengths == 24).nonzero()[0, 0]) if (lengths == 24).any() else 0
    for layer, ax in enumerate(axes[2:]):
        ax.imshow(maps[layer][example, 0].cpu().numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set(xlabel="attended position", ylabel="position", title=(
            f"GPT layer 1: previous token\n({100 * prev:.0f}% of weight)" if layer == 0 else
            f"GPT layer 2: induction stripe\n({100 * induct:.0f}% of weight)"))
    fig.tight_layout()
    save_wrapped(ctx, fig, "induction.png", f"{detail}; maps: seed 0, one sequence with a "
                 f"{int(lengths[example])}-token segment")
    return prev, induct


# ----- mqar: recall against the number of pairs and the bytes of state -----

@dataclass
class Point:
    """One model at one width, trained on the mix of pair counts: its bytes of state after each count's 3 x pairs
    tokens, and its test accuracy there, one entry per seed."""
    name: str
    width: int
    trained: Trained
    bytes: dict  # pairs -> bytes of state
    test: dict  # pairs -> [accuracy per seed]

    def solves(self, n):
        return min(self.test[n]) >= LEVEL

    def fails(self, n):
        return max(self.test[n]) < LEVEL


def recall_merit(runs):
    """MQAR's choice on the selection sets: the most seeds solving every pair count, then (all solving) the fewest
    steps, else the best mean selection accuracy."""
    solved = sum(run.solved for run in runs)
    return solved, -sum(run.steps for run in runs) if solved == len(runs) else sum(run.select for run in runs)


def mqar_status(points, pairs, name):
    """(status, why) of RULE_MQAR for one recurrent model against the GPT."""
    gpts = sorted((p for p in points if p.name == "gpt"), key=lambda p: p.width)
    rivals = [p for p in points if p.name == name]
    solving = {n: next((p for p in gpts if p.solves(n)), None) for n in pairs}  # the narrowest solving GPT
    solved = [n for n in pairs if solving[n]]
    if not solved:
        return "not shown here", "no GPT width solves any pair count"
    top = max(solved)
    small = [p for p in rivals if p.solves(top) and p.bytes[top] <= solving[top].bytes[top]]
    if small:
        return "contradicted here", (f"width {small[0].width} ({small[0].bytes[top]:,} B) solves {top} pairs, the GPT "
                                     f"needing {solving[top].bytes[top]:,} B")
    lost = [n for n in solved if solving[n] is gpts[0] and all(p.fails(n) for p in rivals)]
    if not any(p.solves(pairs[0]) for p in rivals):
        return "not shown here", f"no width solves even {pairs[0]} pairs, so no failure is tied to the pairs"
    if not lost:
        return "not shown here", "no pair count that the narrowest GPT solves and every width fails"
    return "shown here", f"solves {pairs[0]} pairs but every width fails {lost[0]}, which a GPT of " \
                         f"{gpts[0].bytes[lost[0]]:,} B solves"


def mqar_verdict(points, pairs):
    """(evidence, status) by RULE_MQAR for every recurrent model among points."""
    rivals = [name for name in RECURRENT if any(p.name == name for p in points)]
    found = {name: mqar_status(points, pairs, name) for name in rivals}
    evidence = "; ".join(f"{LABELS[name]}: {why} ({status})" for name, (status, why) in found.items())
    return evidence, combined([status for status, _ in found.values()])


def mqar_model(name, width, max_pairs, keys):
    """A 2-layer GPT (1 head, as synthetic_models'), LSTM or minGRU of width, for 3 x max_pairs tokens."""
    return ModelConfig(type=name, vocab_size=2 * keys + 1, block_size=3 * max_pairs, n_layer=2, n_head=1,
                       n_embd=width, tie_weights=False)


def accuracy_cell(points, name, n):
    """Each width's test accuracy at n pairs (min-max over seeds) and its bytes of state there."""
    return "; ".join(f"{p.width}: {percent_range(p.test[n])} ({p.bytes[n]:,} B)" for p in points if p.name == name)


def exp_mqar(ctx):
    """Multi-query associative recall, trained on a mix of pair counts and tested at each: each query asks for the
    value its key had. Each model at each of its widths, at its best recipe; accuracy set against bytes of state."""
    b = BUDGET[ctx.preset]
    part = b["mqar"]
    pairs, keys = part["pairs"], part["keys"]
    select = {n: recall_batch(b["selection"], n, keys, generator=seeded(100 + n)) for n in pairs}
    test = {n: recall_batch(b["test"], n, keys, generator=seeded(200 + n)) for n in pairs}

    def make(it, g):
        return mixed_recall_batch(b["batch"], min(pairs), max(pairs), keys, generator=g)

    points, task = [], Task("mqar", make, select, test)
    for name in MODELS:
        for width in part["widths"][name]:
            cfg = mqar_model(name, width, max(pairs), keys)
            trained = train_best(ctx, task, cfg, name, f"width {width}", b, part, recall_merit)
            points.append(Point(name, width, trained, {n: state_bytes(cfg, 3 * n) for n in pairs},
                                {n: [run.test[n] for run in trained.runs] for n in pairs}))
    detail = ("2-layer GPT (1 head), LSTM and minGRU at widths " + "; ".join(
        f"{LABELS[n]} {'/'.join(map(str, part['widths'][n]))}" for n in MODELS) + f"; {keys} keys, each batch "
        f"{min(pairs)}-{max(pairs)} pairs (log-uniform), queries right after the pairs; state: the GPT's KV cache "
        f"after 3 x pairs tokens, the LSTM's h and c, the minGRU's h (fp32); " + protocol_text(b, part))
    mqar_figure(ctx, points, pairs, detail)
    attention_figure(ctx, next(p for p in points if p.name == "gpt").trained.runs[0].model,
                     *recall_batch(1, min(8, max(pairs)), keys, generator=seeded(7)), keys)
    for n in pairs:
        ctx.row("mqar", f"{n} pairs ({3 * n} tokens): test accuracy % by width (bytes of state), min-max over "
                f"{part['seeds']} seeds", accuracy_cell(points, "gpt", n), accuracy_cell(points, "lstm", n),
                f"chance (1/pairs) {100 / n:.1f}%", accuracy_cell(points, "mingru", n))
    recipes = {name: "; ".join(f"{p.width}: {p.trained.recipe_text()}" for p in points if p.name == name)
               for name in MODELS}
    seconds = {name: sum(p.trained.seconds for p in points if p.name == name) for name in MODELS}
    ctx.row("mqar", "recipe chosen on the selection sets, by width", recipes["gpt"], recipes["lstm"],
            f"cap {part['steps']} steps of {b['batch']}; training " + " / ".join(f"{seconds[n]:.0f} s" for n in MODELS)
            + " (every run, GPT / LSTM / minGRU)", recipes["mingru"])
    ctx.verdict("mqar", "c", *mqar_verdict(points, pairs), rule=RULE_MQAR)


def mqar_figure(ctx, points, pairs, detail):
    """Test accuracy against pairs, and against bytes of state (one line per width: a GPT's moves right as its cache
    grows with the pairs, a recurrent one stays put)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = ("o-", "s--", "^:")
    for p in points:
        rank = [q.width for q in points if q.name == p.name].index(p.width)
        mean = [100 * statistics.mean(p.test[n]) for n in pairs]
        low = [100 * min(p.test[n]) for n in pairs]
        high = [100 * max(p.test[n]) for n in pairs]
        label = f"{LABELS[p.name]} width {p.width}"
        left.fill_between(pairs, low, high, color=COLORS[p.name], alpha=0.15)
        left.plot(pairs, mean, styles[rank % 3], color=COLORS[p.name], label=label)
        right.plot([p.bytes[n] for n in pairs], mean, styles[rank % 3], color=COLORS[p.name], label=label)
        for n, x, y in zip(pairs, [p.bytes[n] for n in pairs], mean):
            right.annotate(str(n), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    left.plot(pairs, [100 / n for n in pairs], "k:", lw=0.8, label="chance: 1 / pairs")
    left.set_xscale("log", base=2)
    left.minorticks_off()
    left.set(xlabel="key-value pairs (3 x pairs tokens)", ylabel="test query accuracy (%, band min-max over seeds)",
             xticks=pairs, xticklabels=pairs, ylim=(0, 102), title="multi-query associative recall")
    right.axhline(100 * LEVEL, color="gray", ls="--", lw=0.6)
    right.set_xscale("log")
    right.xaxis.set_minor_formatter(NullFormatter())  # less than a decade apart: minor labels would overlap
    ticks = sorted({p.bytes[n] for p in points for n in pairs})
    right.set_xticks(ticks, [f"{b:,}" for b in ticks], rotation=60, fontsize=6)
    right.set(xlabel="bytes of state at that many pairs (log; labels: pairs)", ylabel="mean test accuracy (%)",
              ylim=(0, 102), title="against bytes of state")
    for ax in (left, right):
        ax.legend(fontsize=7)
    save_wrapped(ctx, fig, "mqar.png", detail)


def attention_figure(ctx, model, x, y, keys):
    """The trained GPT's two layers on one sequence, with where each query should look circled."""
    n_pairs = int((y >= 0).sum())
    maps = model.attention_maps(x.to(ctx.device))  # per layer (1, 1, T, T)
    end = 3 * n_pairs
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    tokens = x[0, :end].tolist()
    for layer, ax in enumerate(axes):
        ax.imshow(maps[layer][0, 0, :end, :end].cpu().numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set(title=f"layer {layer + 1}", xlabel="attended position (key)", ylabel="position (query)")
        ax.set_xticks(range(end), [str(t) for t in tokens], fontsize=5, rotation=90)
        ax.set_yticks(range(end), [str(t) for t in tokens], fontsize=5)
    for q in range(2 * n_pairs, end):  # circle where each query should look: the value right after its key
        key = tokens[:2 * n_pairs:2].index(tokens[q]) * 2
        axes[1].plot(key + 1, q, "o", mfc="none", mec="red", ms=5)
        axes[0].plot(key, key + 1, "o", mfc="none", mec="red", ms=5)
    fig.suptitle(f"trained GPT on {n_pairs} pairs: layer 1 tags each value with its key (previous token); in layer 2 "
                 f"each query reads the value after its key", fontsize=9)
    save_wrapped(ctx, fig, "mqar_attention.png", f"the narrowest GPT, seed 0; tick labels are token ids (keys "
                 f"1-{keys}, values {keys + 1}-{2 * keys}, filler 0); red circles mark the expected position")
