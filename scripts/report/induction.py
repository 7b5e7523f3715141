"""Reason (c), content-based retrieval, as learning speed: a random segment repeated, and the steps each model needs
to copy it back (90% and 99% of the second copy right on the test set, scored along the way, which chooses nothing).
Copying needs a look-up by content: a previous-token head, then an induction head (Olsson et al. 2022). A GPT, an LSTM
and a minGRU of equal parameter count, each at its best recipe (tasks.train_best), 5 seeds.
    python -m scripts.report --only induction
"""
from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
import torch

from scripts.report.protocol import combined, ratio_range
from scripts.report.tasks import (
    COLORS,
    LABELS,
    MODELS,
    RECURRENT,
    Budget,
    Task,
    induction_batch,
    percent_range,
    protocol_text,
    save_wrapped,
    seeded,
    steps_to,
    synthetic_models,
    tested,
    train_best,
    unseen_chance,
)

LEVELS = (0.9, 0.99)  # steps to these test accuracies
SPEEDUP = 2  # the factor by which a recurrent model must be slower over every seed pairing
RULE = (
    "steps to 90% test accuracy on the second copy (the test set scored every eval step, never chosen on), each model "
    "at its best recipe, over every pairing of a GPT seed with a recurrent seed; a run that never reaches 90% counts "
    "at the cap, so a ratio against it is a lower bound (the cap over the GPT's steps). Shown here if every GPT seed "
    "reaches 99% and, for the LSTM and for the minGRU, every pairing's ratio "
    "(recurrent / GPT) exceeds 2; contradicted here if, for the LSTM or the minGRU, every seed reaches 90% and every "
    "pairing's ratio is at most 1; otherwise not shown here")


@dataclass(frozen=True)
class InductionBudget(Budget):
    n_embd: int = 32  # the GPT's width; the LSTM and the minGRU match its parameter count


# quick's cap is past twice the GPT's steps to 90% at every GPT grid point; the rule needs that
QUICK = InductionBudget(steps=600)
BUDGET = dict(quick=QUICK, full=replace(QUICK, widen=2, selection=192, test=512, steps=1000))


@dataclass
class Speed:
    """Steps to one accuracy, one entry per seed; None where the run never reached it by the cap."""
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
    """The choice on the selection set: the most seeds at 90%, then the fewest steps to it (a run that never reaches
    counted at its cap), then the best selection accuracy."""
    steps = [steps_to(run, LEVELS[0]) for run in runs]
    bounded = [step if step is not None else run.steps for step, run in zip(steps, runs)]
    return sum(step is not None for step in steps), -sum(bounded), sum(run.select for run in runs)


def speed_status(gpt90: Speed, gpt99: Speed, other90: Speed):
    """RULE for one recurrent model against the GPT."""
    ratios = [r / g for r in other90.bounded for g in gpt90.bounded]
    if gpt99.reached and min(ratios) > SPEEDUP:
        return "shown here"
    if other90.reached and max(ratios) <= 1:
        return "contradicted here"
    return "not shown here"


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
    """(evidence, status) by RULE from speeds {model: {level: Speed}} (the GPT and its recurrent rivals)."""
    gpt = speeds["gpt"]
    rivals = [name for name in RECURRENT if name in speeds]
    statuses = [speed_status(gpt[LEVELS[0]], gpt[LEVELS[1]], speeds[name][LEVELS[0]]) for name in rivals]
    evidence = (f"steps to 90%: GPT {gpt[LEVELS[0]].text()}; " + "; ".join(
        f"{LABELS[name]} {speeds[name][LEVELS[0]].text()}, ratio to the GPT "
        f"{ratio_text(speeds[name][LEVELS[0]], gpt[LEVELS[0]])} ({status})" for name, status in zip(rivals, statuses))
        + f"; GPT steps to 99%: {gpt[LEVELS[1]].text()}")
    return evidence, combined(statuses)


def exp_induction(ctx):
    """Every model at equal parameter count and at its best recipe: steps to copy a repeated random segment."""
    b = BUDGET[ctx.preset]
    configs = synthetic_models(33, 64, b.n_embd)
    select = {"second copy": induction_batch(b.selection, generator=seeded(300))[:2]}
    *test_set, test_lengths = induction_batch(b.test, generator=seeded(400))
    test = {"second copy": test_set}
    chance = {"uniform over the 32 tokens": 1 / 32,  # filler 0 is never a target
              "uniform over the segment's tokens not yet seen in the second copy": unseen_chance(test_lengths.tolist())}

    def make(it, g):
        return induction_batch(b.batch, generator=g)[:2]

    task = Task("induction", make, select, test, tracked=True)
    trained = {name: train_best(ctx, task, cfg, name, f"width {cfg.n_embd}", b, speed_merit, LEVELS)
               for name, cfg in configs.items()}
    speeds = {name: {level: Speed([steps_to(run, level, tested(test)) for run in t.runs], b.steps)
                     for level in LEVELS} for name, t in trained.items()}
    n_params = {name: t.runs[0].model.num_params() for name, t in trained.items()}
    prev, induct = induction_figure(ctx, trained, speeds, chance, b, (
        "2-layer GPT (1 head), LSTM and minGRU of equal size (" + ", ".join(
            f"{LABELS[n]} width {configs[n].n_embd}, {n_params[n]:,} params" for n in MODELS) + "); segments of 8-32 "
        "distinct tokens out of 32; " + protocol_text(b) + "; chosen: " + "; ".join(
            f"{LABELS[n]} {t.recipe_text()}" for n, t in trained.items())))
    for level in LEVELS:
        ctx.row("induction", f"steps to {100 * level:g}% test accuracy on the second copy, per seed "
                "(>cap: not reached)", speeds["gpt"][level].text(), speeds["lstm"][level].text(),
                "ratio to the GPT (median, range over seed pairings): " + "; ".join(
                    f"{LABELS[n]} {ratio_text(speeds[n][level], speeds['gpt'][level])}" for n in RECURRENT)
                + f"; eval every {b.eval_every} steps, cap {b.steps}", speeds["mingru"][level].text())
    accuracy = {name: [run.test["second copy"] for run in t.runs] for name, t in trained.items()}
    ctx.row("induction", f"test accuracy % on the second copy at the end (min-max over {b.seeds} seeds)",
            *(percent_range(accuracy[n], 1) for n in ("gpt", "lstm")),
            "chance " + ", ".join(f"{label} {100 * level:.1f}%" for label, level in chance.items()) + "; recipes: "
            + "; ".join(f"{LABELS[n]} {t.recipe_text()}" for n, t in trained.items()) + "; training "
            + " / ".join(f"{t.seconds:.0f} s" for t in trained.values()) + " (every run, GPT / LSTM / minGRU)",
            percent_range(accuracy["mingru"], 1))
    ctx.row("induction", "GPT attention: layer 1 on the previous token / layer 2 on the induction target",
            f"{100 * prev:.0f}% / {100 * induct:.0f}%", "", "seed 0, averaged over the second copy of 256 sequences")
    ctx.verdict("induction", "c", *induction_verdict(speeds), rule=RULE)


def induction_figure(ctx, trained, speeds, chance, b, detail):
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
            at = col + (0.15 if marker == "s" else -0.15)
            axes[1].plot([at] * len(reached), reached, marker, color=COLORS[name],
                         mfc="none" if marker == "s" else COLORS[name], alpha=0.7)
            missed = len(speed.steps) - len(reached)
            axes[1].plot([at] * missed, [1.05 * b.steps] * missed, "x", color=COLORS[name])
    axes[1].axhline(b.steps, color="gray", ls="--", lw=0.6)
    axes[1].set_xticks(range(len(MODELS)), [LABELS[n] for n in MODELS])
    axes[1].set(ylabel="steps", ylim=(0, 1.1 * b.steps), title="steps to 90% (filled) and 99% (open) per seed\n"
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

