"""Recall and induction: can the model look a value up, or copy a repeat, from anywhere in its context? Both models
go through the same grid (scripts/report/tasks.py's tune): equal step cap, batch and schedule, no early stop short of
solving the task, an lr grid per model chosen on a selection set, three seeds at the chosen lr, and accuracy read on
a separate test set. recall_state trains each model at several widths on a fixed number of pairs and sets accuracy
against the bytes of state each carries (Zoology, Arora et al. 2023: a recurrent state must grow with the pairs)."""
import textwrap
from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import NullFormatter

from scripts.report.tasks import (
    FLAT_SE,
    Tuned,
    induction_batch,
    mixed_recall_batch,
    recall_batch,
    state_bytes,
    steps_to,
    synthetic_models,
    tune,
    unseen_chance,
)

PAIRS = (4, 8, 16, 32, 64)  # recall is trained on 4..64 pairs at once and tested at each of these
SHOWN = (4, 16, 64)  # the pairs the results table reports
N_KEYS = 64  # distinct keys (and values) per task: enough for 64 pairs
SEEDS = (0, 1, 2)  # the chosen lr runs with every seed; the spread over them (min-max) is reported
LEVEL = 0.9  # recall_state: a width "solves" a pair count when every seed reaches this test accuracy
# model -> optimizer (train_synthetic: muon = Muon on the hidden matrices and AdamW elsewhere, adamw = AdamW on all)
MUON, LSTM_ADAMW = {"gpt": "muon", "lstm": "muon"}, {"gpt": "muon", "lstm": "adamw"}
# Sized as steps x the measured time of one step (docs/report.md has the wall times): a 2-layer LSTM step grows
# ~ width^2 x tokens, a small GPT's is nearly flat. The estimate lets every LSTM run go to the cap.
BUDGET = {  # what the experiments may spend; both models always get the same cap, batch, schedule and lr grid
    "quick": dict(
        batch=32,  # sequences per training step
        recall_steps=600,  # the step cap of every recall run (warmup + cosine to it)
        induction_steps=600,  # the step cap of every induction run
        lrs={"gpt": (3e-3, 1e-2, 3e-2), "lstm": (3e-3, 1e-2, 3e-2)},  # the grid at the reference widths
        grid_seeds=1,  # seeds per grid point; the chosen lr then runs the rest of SEEDS
        selection=96,  # sequences per selection set (recall: per number of pairs), scored every eval_every steps
        test=256,  # sequences per test set (recall: per number of pairs), scored once per run
        optimizer=dict(  # each model's optimizer per experiment: the better one measured at this cap (docs/log.md)
            recall=MUON, induction=MUON, recall_state=MUON),
        # recall_state: pairs -> LSTM widths. h and c hold 16 B per unit, a width-d GPT's KV cache 16 x d B per token,
        # so the LSTM meets the width-8 GPT at 24 x pairs units and the width-16 one at 48 x pairs
        # (4 pairs only: no LSTM solved 4 at this cap, so 8 told nothing more; 192 holds the solving GPT-16's cache)
        state=dict(steps=600, gpt=(8, 16), lstm={4: (48, 192)},
                   lrs={"gpt": (3e-3, 1e-2, 3e-2), "lstm": (3e-3, 1e-2, 3e-2)}),
    ),
    "full": dict(batch=32, recall_steps=1000, induction_steps=2000, lrs={"gpt": (3e-3, 1e-2, 3e-2),
                 "lstm": (3e-3, 1e-2, 3e-2)}, grid_seeds=1, selection=192, test=512,
                 # the LSTM's better optimizer changes with the cap (docs/log.md)
                 optimizer=dict(recall=MUON, induction=LSTM_ADAMW, recall_state=LSTM_ADAMW),
                 # a 5,000-step cap; at 4 pairs the LSTM's widths hold the width-8 and width-16 GPTs' caches, at 8
                 # and 16 its widest meets the width-8 one. 8 and 16 pairs train only once an LSTM solves the count
                 # before (a width-384 step costs ~30x a width-48 one)
                 state=dict(steps=5000, gpt=(8, 16), lstm={4: (96, 192), 8: (96, 192), 16: (192, 384)},
                            lrs={"gpt": (3e-3, 1e-2, 3e-2), "lstm": (3e-3, 1e-2, 3e-2)})),
}
TRAIN = dict(eval_every=50, stop_at=0.99)  # train_synthetic's only early stop: solved, stated in every figure


def seeded(seed):
    return torch.Generator().manual_seed(seed)


def save(ctx, fig, name, detail):
    """ctx.save with the detail wrapped to the figure's width, so a long protocol line does not widen the PNG."""
    ctx.save(fig, name, textwrap.fill(detail, int(20 * fig.get_figwidth())))


def spread(values, digits=0):
    """Percentages over seeds as 'min-max', or one number when they agree to the last digit shown."""
    low, high = f"{100 * min(values):.{digits}f}", f"{100 * max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def lrs_text(lrs):
    return "/".join(f"{lr:g}" for lr in lrs)


def optimizers(optimizer):
    """Each model's optimizer, for the detail lines."""
    return ", ".join(f"{name} {optimizer[name]}" for name in ("gpt", "lstm")) + (
        " (muon: Muon on the hidden matrices at its default muon_lr, AdamW at lr elsewhere; adamw: AdamW on all)")


def protocol(b, steps, lrs, optimizer):
    """The training and selection protocol in one sentence, for the figures' detail lines."""
    grid = ", ".join(f"{name} {lrs_text(lrs[name])}" for name in ("gpt", "lstm"))
    return (f"optimizer {optimizers(optimizer)}; "
            f"both models: batch {b['batch']}, the same cap of {steps} steps (warmup + cosine to the cap), scored "
            f"every {TRAIN['eval_every']}; a run stops before the cap only once it solves the task "
            f"({100 * TRAIN['stop_at']:g}% on every selection set); lr grid {grid} with seed "
            f"{', '.join(map(str, SEEDS[:b['grid_seeds']]))}, widened up to 3 steps past a winning end unless flat "
            f"(best and worst within {FLAT_SE} standard errors, none solving), the lr best on the selection set run "
            f"with seeds {', '.join(map(str, SEEDS))}; test-set accuracy, min-max over seeds")


def lr_note(name, tuned, optimizer):
    """The chosen lr, the grid actually tried, and whether the choice still sits at its edge."""
    return f"{name} ({optimizer}) lr {tuned.lr:g} of {lrs_text(tuned.lrs)}" + edge_note(tuned, " (at the grid's edge)")


def edge_note(tuned, at_edge):
    """What the choice's place in its grid means: at an edge after widening, or a flat grid (not widened)."""
    return at_edge if tuned.edge else " (flat: every lr alike, not widened)" if tuned.flat else ""


def improving_note(name, tuned):
    n = sum(run.improving for run in tuned.runs.values())
    return f"{name}: {n} of {len(tuned.runs)} seeds still improving at the cap" if n else ""


def grid_note(tuned, optimizer):
    """Each model's optimizer and chosen lr in the grid tried, and any seed the cap stopped while still improving."""
    notes = [lr_note(name, tuned[name], optimizer[name]) for name in ("gpt", "lstm")]
    notes += [improving_note(name, tuned[name]) for name in ("gpt", "lstm")]
    return "; ".join(note for note in notes if note)


def exp_recall(ctx):
    """Multi-query associative recall, 4 to 64 pairs in one training mix: each query asks for the value its key had.
    Both models at equal parameter count."""
    b = BUDGET[ctx.preset]
    configs = synthetic_models(2 * N_KEYS + 1, 3 * max(PAIRS))
    select = {n: recall_batch(b["selection"], n, N_KEYS, generator=seeded(100 + n)) for n in PAIRS}
    test = {n: recall_batch(b["test"], n, N_KEYS, generator=seeded(200 + n)) for n in PAIRS}
    def make(it, g):
        return mixed_recall_batch(b["batch"], min(PAIRS), max(PAIRS), N_KEYS, generator=g)
    opt = b["optimizer"]["recall"]
    tuned = {name: tune(ctx, "recall", name, cfg, make, b["lrs"][name], SEEDS, b["recall_steps"], select, test,
                        f"width {cfg.n_embd}", b["grid_seeds"], optimizer=opt[name], **TRAIN)
             for name, cfg in configs.items()}
    def scores(t, n):
        return [run.test[n] for run in t.runs.values()]
    n_params = {name: tuned[name].runs[0].model.num_params() for name in configs}
    detail = (f"2-layer GPT (width {configs['gpt'].n_embd}, {n_params['gpt']:,} params) vs 2-layer LSTM "
              f"(width {configs['lstm'].n_embd}, {n_params['lstm']:,}); {N_KEYS} keys, each batch {min(PAIRS)}-"
              f"{max(PAIRS)} pairs (log-uniform); " + protocol(b, b["recall_steps"], b["lrs"], opt))
    recall_figure(ctx, tuned, scores, detail)
    attention_figure(ctx, tuned["gpt"].runs[0].model, *recall_batch(1, 8, N_KEYS, generator=seeded(7)), 8)
    ctx.row("recall", f"MQAR accuracy % at {' / '.join(map(str, SHOWN))} pairs (test; min-max over {len(SEEDS)} seeds)",
            *(" / ".join(spread(scores(tuned[name], n)) for n in SHOWN) for name in configs),
            f"equal size ({n_params['gpt']:,} vs {n_params['lstm']:,} params); chance (1/pairs) "
            f"{' / '.join(f'{100 / n:.1f}' for n in SHOWN)}; {grid_note(tuned, opt)}; at most {b['recall_steps']} "
            f"steps of {b['batch']}; {tuned['gpt'].seconds:.0f} s / {tuned['lstm'].seconds:.0f} s of training, "
            f"every run")


def state_model(name, width, n_pairs):
    """synthetic_models' GPT (2 layers, 1 head) or LSTM (2 layers) at another width, for 3 x n_pairs tokens."""
    return replace(synthetic_models(2 * N_KEYS + 1, 3 * n_pairs)[name], n_embd=width)


@dataclass
class Point:
    """One width at one number of pairs: its bytes of state, test accuracy and steps to LEVEL per seed (None: not
    reached), and its grid."""
    bytes: int
    test: list
    steps: list
    tuned: Tuned

    @property
    def solves(self):
        return min(self.test) >= LEVEL

    @property
    def fails(self):
        return max(self.test) < LEVEL


def exp_recall_state(ctx):
    """Recall at a fixed number of pairs against the bytes of state: a GPT's KV cache grows with the 3 x pairs tokens
    it reads, an LSTM's h and c only with its width, so an LSTM should need a wider state for more pairs."""
    b, s = BUDGET[ctx.preset], BUDGET[ctx.preset]["state"]
    opt = b["optimizer"]["recall_state"]
    points, pairs = {}, []  # (name, n_pairs, width) -> Point; the pair counts trained
    for n in s["lstm"]:
        if pairs and not any(p.solves for _, p in at(points, "lstm", pairs[-1])):
            break  # more pairs cannot tie an LSTM's failure to its state while it fails the fewer; a row says so
        pairs.append(n)
        select = {n: recall_batch(b["selection"], n, N_KEYS, generator=seeded(100 + n))}
        test = {n: recall_batch(b["test"], n, N_KEYS, generator=seeded(200 + n))}
        def make(it, g, n=n):
            return recall_batch(b["batch"], n, N_KEYS, generator=g)
        for name, widths in (("gpt", s["gpt"]), ("lstm", s["lstm"][n])):
            for width in widths:
                cfg = state_model(name, width, n)
                tuned = tune(ctx, "recall_state", name, cfg, make, s["lrs"][name], SEEDS, s["steps"], select, test,
                             f"{n} pairs, width {width}", b["grid_seeds"], optimizer=opt[name], **TRAIN)
                points[name, n, width] = Point(state_bytes(cfg, 3 * n), [run.test[n] for run in tuned.runs.values()],
                                               [steps_to(run, LEVEL) for run in tuned.runs.values()], tuned)
    detail = (f"2-layer GPT (1 head) and 2-layer LSTM at each width, trained and tested on a fixed number of pairs "
              f"({N_KEYS} keys, 3 x pairs tokens); GPT state: its KV cache after those tokens, LSTM: h and c; "
              + protocol(b, s["steps"], s["lrs"], opt) + f"; steps to {100 * LEVEL:g}% read from the selection curve")
    state_figure(ctx, points, pairs, s["steps"], detail)
    for n in pairs:
        ctx.row("recall_state", f"narrowest width solving {n} pairs ({3 * n} tokens): >= {100 * LEVEL:g}% test "
                f"accuracy on every seed (bytes of state)", *(narrowest(points, name, n) for name in ("gpt", "lstm")),
                state_note(points, n, s, b["batch"], opt))
    skipped = [n for n in s["lstm"] if n not in pairs]
    if skipped:
        ctx.row("recall_state", f"{'/'.join(map(str, skipped))} pairs", "not trained", "not trained",
                f"no LSTM width solved {pairs[-1]} pairs (widths {'/'.join(map(str, s['lstm'][pairs[-1]]))}), so "
                f"a failure at more pairs could not be tied to its state size; the budget stops there")
    ctx.verdict("recall_state", "c", *state_verdict(points, tuple(pairs)))


def at(points, name, n):
    return sorted((width, p) for (model, pairs, width), p in points.items() if model == name and pairs == n)


def narrowest(points, name, n):
    good = [(width, p) for width, p in at(points, name, n) if p.solves]
    if good:
        return f"{good[0][0]} ({good[0][1].bytes:,} B)"
    widths = at(points, name, n)
    return f"none of {'/'.join(str(w) for w, _ in widths)} (up to {widths[-1][1].bytes:,} B)"


def state_note(points, n, s, batch, optimizer):
    """Each width's accuracy, the lrs chosen in the grids tried, and the runs still improving at the cap."""
    parts = []
    for name in ("gpt", "lstm"):
        widths = at(points, name, n)
        accuracy = ", ".join(f"{w}: {spread(p.test)}" for w, p in widths)
        lrs = ", ".join(f"{w}: {p.tuned.lr:g} of {lrs_text(p.tuned.lrs)}" + edge_note(p.tuned, " (at the edge)")
                        for w, p in widths)
        improving = sum(run.improving for _, p in widths for run in p.tuned.runs.values())
        parts.append(f"{name} ({optimizer[name]}) test % by width {accuracy}; lr {lrs}; {improving} of "
                     f"{sum(len(p.tuned.runs) for _, p in widths)} chosen-lr runs still improving at the cap")
    lstm, gpt = at(points, "lstm", n)[-1][1].bytes, at(points, "gpt", n)[0][1].bytes
    overlap = "reaches" if lstm >= gpt else "stays below"
    return (f"min-max over {len(SEEDS)} seeds; chance (1/pairs) {100 / n:.1f}%; the widest LSTM's state ({lstm:,} B) "
            f"{overlap} the narrowest GPT's KV cache ({gpt:,} B); " + "; ".join(parts) +
            f"; at most {s['steps']} steps of {batch}")


def state_verdict(points, pairs):
    """(evidence, status) for reason (c), from the Points alone. Contradicted: at 16 pairs or more an LSTM whose state
    is no larger than the narrowest solving GPT's KV cache solves. Shown: at some pair count an LSTM with at least
    that GPT's bytes fails (every seed below LEVEL) where the GPT solves, and the narrowest LSTM width that solves
    grows with the pairs (never shrinks, ends wider or unsolved). Otherwise not shown, saying what is missing."""
    def gpt_bytes(n):  # the narrowest solving GPT's KV cache at n pairs, None if no width solves
        return next((p.bytes for _, p in at(points, "gpt", n) if p.solves), None)

    def lstm_width(n):  # the narrowest solving LSTM width at n pairs; inf if none solves
        return next((w for w, p in at(points, "lstm", n) if p.solves), float("inf"))

    for n in pairs:
        small = [(w, p) for w, p in at(points, "lstm", n) if p.solves and gpt_bytes(n) and p.bytes <= gpt_bytes(n)]
        if n >= 16 and small:
            w, p = small[0]
            return (f"at {n} pairs an LSTM of width {w} ({p.bytes:,} B of state) reaches {spread(p.test)}%, within the "
                    f"narrowest solving GPT's {gpt_bytes(n):,} B", "contradicted here")
    beaten = [(n, p) for n in pairs if gpt_bytes(n) for _, p in at(points, "lstm", n)
              if p.bytes >= gpt_bytes(n) and p.fails]
    need = [lstm_width(n) for n in pairs]
    grows = need[0] < float("inf") and all(a <= b for a, b in zip(need, need[1:])) and need[-1] > need[0]
    needed = "/".join("none" if w == float("inf") else str(w) for w in need)
    trend = f"narrowest solving LSTM width {needed} at {'/'.join(map(str, pairs))} pairs"
    if beaten and grows:
        n, p = beaten[0]
        return (f"at {n} pairs a GPT with a {gpt_bytes(n):,} B cache solves while an LSTM with {p.bytes:,} B reaches "
                f"{spread(p.test)}%; {trend}", "shown here")
    if not any(gpt_bytes(n) for n in pairs):
        missing = "a GPT width that solves some pair count"
    elif not beaten:
        missing = "an LSTM at least as large as the GPT's cache that fails where the GPT solves"
    elif need[0] == float("inf"):
        missing = f"an LSTM that solves {pairs[0]} pairs, so that its failures can be tied to its state size"
    else:
        missing = "a narrowest solving LSTM width that grows with the pairs"
    return f"needs {missing}; {trend}", "not shown here"


def state_figure(ctx, points, pairs, cap, detail):
    """Per pair count: test accuracy and steps to LEVEL against bytes of state, both models, chance and LEVEL."""
    fig, axes = plt.subplots(2, len(pairs), figsize=(3.6 * len(pairs), 7), squeeze=False)
    for col, n in enumerate(pairs):
        top, bottom = axes[0, col], axes[1, col]
        for name, style, color in (("gpt", "o-", "C0"), ("lstm", "s--", "C1")):
            widths = at(points, name, n)
            x = [p.bytes for _, p in widths]
            mean = [100 * sum(p.test) / len(p.test) for _, p in widths]
            bars = [[max(0, m - 100 * min(p.test)) for m, (_, p) in zip(mean, widths)],  # >= 0 despite rounding
                    [max(0, 100 * max(p.test) - m) for m, (_, p) in zip(mean, widths)]]
            top.errorbar(x, mean, yerr=bars, fmt=style, color=color, capsize=2,
                         label=f"{name}, widths {'/'.join(str(w) for w, _ in widths)}")
            for _, p in widths:
                reached = [step for step in p.steps if step is not None]
                bottom.plot([p.bytes] * len(reached), reached, style[0], color=color, alpha=0.6)
                missed = len(p.steps) - len(reached)
                # each model's x at its own height, so that one model's miss cannot hide the other's at equal bytes
                bottom.plot([p.bytes] * missed, [{"gpt": 1.04, "lstm": 1.1}[name] * cap] * missed, "x", color=color)
        top.axhline(100 / n, color="k", ls=":", lw=0.8, label="chance: 1 / pairs")
        top.axhline(100 * LEVEL, color="gray", ls="--", lw=0.6)
        bottom.axhline(cap, color="gray", ls="--", lw=0.6)
        ticks = sorted({p.bytes for name in ("gpt", "lstm") for _, p in at(points, name, n)})
        for ax in (top, bottom):
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # less than a decade apart: minor labels would overlap
            ax.set_xticks(ticks, [f"{b:,}" for b in ticks])  # every model's bytes, where a decade may show none
        top.set(title=f"{n} pairs ({3 * n} tokens)", ylim=(0, 102), xlabel="bytes of state (log)",
                ylabel="test accuracy (%, bars min-max over seeds)" if col == 0 else None)
        bottom.set(ylim=(0, 1.15 * cap), xlabel="bytes of state (log)",
                   ylabel=f"steps to {100 * LEVEL:g}% selection accuracy\n(x: not reached by the cap, dashed)"
                   if col == 0 else None)
        top.legend(fontsize=7)
    fig.suptitle("recall against bytes of state (GPT: KV cache after 3 x pairs tokens; LSTM: h and c), one marker "
                 "per width", fontsize=10)
    save(ctx, fig, "recall_state.png", detail)


def recall_figure(ctx, tuned, scores, detail):
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        low, mean, high = ([100 * f(scores(tuned[name], n)) for n in PAIRS]
                           for f in (min, lambda a: sum(a) / len(a), max))
        a.fill_between(PAIRS, low, high, color=color, alpha=0.3)
        a.plot(PAIRS, mean, "o-", color=color, label=f"{name}, lr {tuned[name].lr:g} (mean of seeds)")
        for seed, run in tuned[name].runs.items():
            for n, style in zip(SHOWN[1:], ("--", "-")):
                b.plot([s for s, _ in run.curve], [100 * acc[n] for _, acc in run.curve], style, color=color,
                       alpha=1 if seed == 0 else 0.5, label=f"{name}, {n} pairs" if seed == 0 else None)
    a.plot(PAIRS, [100 / n for n in PAIRS], "k:", lw=0.8, label="chance: 1 / pairs")
    a.set_xscale("log", base=2)
    a.minorticks_off()
    a.set(xlabel="key-value pairs (sequence of 3 x pairs tokens)", ylabel="test query accuracy (%)", xticks=PAIRS,
          xticklabels=PAIRS, title="multi-query associative recall (band: min-max over seeds)", ylim=(0, 102))
    b.set(xlabel="training step", ylabel="selection-set accuracy (%)", title="learning curves at the chosen lr "
          f"(faint: seeds {', '.join(map(str, SEEDS[1:]))})", ylim=(0, 102))
    for n, style in zip(SHOWN[1:], ("--", "-")):
        b.axhline(100 / n, color="k", ls=style, lw=0.6, label=f"chance at {n} pairs")
    for ax in (a, b):
        ax.legend(fontsize=8)
    save(ctx, fig, "recall.png", detail)


def attention_figure(ctx, model, x, y, n_pairs):
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
    save(ctx, fig, "recall_attention.png", f"tick labels are token ids (keys 1-{N_KEYS}, values {N_KEYS + 1}-"
         f"{2 * N_KEYS}, filler 0); red circles mark the expected position")


def exp_induction(ctx):
    """A random segment repeated: copying it back needs a previous-token head and an induction head."""
    b = BUDGET[ctx.preset]
    configs = synthetic_models(33, 64)
    select = {"second copy": induction_batch(b["selection"], generator=seeded(300))[:2]}
    *test_set, test_lengths = induction_batch(b["test"], generator=seeded(400))
    test = {"second copy": test_set}
    chance = {"uniform over the 32 tokens": 1 / 32,  # filler 0 is never a target
              "uniform over the segment's tokens not yet seen in the second copy": unseen_chance(test_lengths.tolist())}
    def make(it, g):
        return induction_batch(b["batch"], generator=g)[:2]
    opt = b["optimizer"]["induction"]
    tuned = {name: tune(ctx, "induction", name, cfg, make, b["lrs"][name], SEEDS, b["induction_steps"], select, test,
                        f"width {cfg.n_embd}", b["grid_seeds"], optimizer=opt[name], **TRAIN)
             for name, cfg in configs.items()}
    x, _, lengths = induction_batch(256, generator=seeded(500))
    maps = tuned["gpt"].runs[0].model.attention_maps(x.to(ctx.device))
    rows = []  # per sequence: second-copy positions t, the positions before them, and after the earlier copy
    for i, S in enumerate(lengths.tolist()):
        t = torch.arange(S, 2 * S - 1)  # the scored positions: inside the second copy
        rows.append((i, t, t - 1, t - S + 1))
    prev = sum(maps[0][i, 0, t, p].mean().item() for i, t, p, _ in rows) / len(rows)
    induct = sum(maps[1][i, 0, t, s].mean().item() for i, t, _, s in rows) / len(rows)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        for seed, run in tuned[name].runs.items():
            axes[0].plot([s for s, _ in run.curve], [100 * a["second copy"] for _, a in run.curve], color=color,
                         alpha=1 if seed == 0 else 0.5, label=f"{name}, lr {tuned[name].lr:g}" if seed == 0 else None)
    for (label, level), style in zip(chance.items(), (":", "--")):
        axes[0].axhline(100 * level, color="k", ls=style, lw=0.7, label=f"chance: {label}")
    axes[0].set(xlabel="training step", ylabel="selection accuracy on the second copy (%)", ylim=(0, 102),
                title=f"copying a repeat (faint: seeds {', '.join(map(str, SEEDS[1:]))})")
    axes[0].legend(fontsize=6, loc="center right")
    example = int((lengths == 24).nonzero()[0, 0]) if (lengths == 24).any() else 0
    for layer, ax in enumerate(axes[1:]):
        ax.imshow(maps[layer][example, 0].cpu().numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set(xlabel="attended position", ylabel="position", title=(
            f"layer 1: previous token ({100 * prev:.0f}% of weight)" if layer == 0 else
            f"layer 2: induction stripe ({100 * induct:.0f}% of weight)"))
    n_params = {name: tuned[name].runs[0].model.num_params() for name in configs}
    steps = {name: " / ".join(str(run.steps) for run in tuned[name].runs.values()) for name in configs}
    save(ctx, fig, "induction.png", f"2-layer GPT ({n_params['gpt']:,} params) vs 2-layer LSTM "
         f"({n_params['lstm']:,}); segments of 8-32 distinct tokens out of 32; "
         f"{protocol(b, b['induction_steps'], b['lrs'], opt)}; "
         f"steps per seed GPT {steps['gpt']}, LSTM {steps['lstm']}; maps: seed 0, one sequence with a "
         f"{int(lengths[example])}-token segment")
    accuracy = {name: [run.test["second copy"] for run in tuned[name].runs.values()] for name in configs}
    ctx.row("induction", f"accuracy % on the repeated half (test; min-max over {len(SEEDS)} seeds)",
            *(spread(accuracy[name], 1) for name in configs),
            "chance " + ", ".join(f"{label} {100 * level:.1f}%" for label, level in chance.items()) +
            f"; {grid_note(tuned, opt)}; steps per seed {steps['gpt']} / {steps['lstm']} of at most "
            f"{b['induction_steps']} (batch {b['batch']}); {tuned['gpt'].seconds:.0f} s / "
            f"{tuned['lstm'].seconds:.0f} s of training")
    ctx.row("induction", "GPT attention: layer 1 on the previous token / layer 2 on the induction target",
            f"{100 * prev:.0f}% / {100 * induct:.0f}%", "", "seed 0, averaged over the second copy of 256 sequences")
    ctx.verdict("induction", "c", *induction_verdict(accuracy, chance))


def induction_verdict(accuracy, chance):
    """Shown: every GPT seed reaches LEVEL and no LSTM seed does, at equal size and cap; contradicted: every LSTM seed
    reaches LEVEL too; otherwise not shown. The evidence sets both against the informed chance."""
    informed = max(chance.values())
    evidence = (f"second-copy test accuracy GPT {spread(accuracy['gpt'], 1)}% vs LSTM {spread(accuracy['lstm'], 1)}% "
                f"(chance knowing the segment's tokens {100 * informed:.1f}%)")
    if min(accuracy["lstm"]) >= LEVEL:
        return evidence, "contradicted here"
    if min(accuracy["gpt"]) >= LEVEL and max(accuracy["lstm"]) < LEVEL:
        return evidence, "shown here"
    return evidence, "not shown here"
