"""Reason (c), content-based retrieval, against bytes of state: multi-query associative recall (Zoology; Arora et al.
2023), trained on a mix of 4-32 key-value pairs and tested at each count, at a few widths of each model. A GPT's KV
cache grows with the tokens it read, a recurrent state does not; a minGRU (a recurrence read in parallel by a scan)
that fails where the LSTM fails puts the failure on the fixed state rather than on sequential training.
    python -m scripts.report --only mqar
"""
import statistics
from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from attnlab.config import ModelConfig
from scripts.report.protocol import combined
from scripts.report.tasks import (
    COLORS,
    LABELS,
    MODELS,
    RECURRENT,
    Budget,
    Task,
    Trained,
    mixed_recall_batch,
    percent_range,
    protocol_text,
    recall_batch,
    save_wrapped,
    seeded,
    state_bytes,
    train_best,
)

LEVEL = 0.9  # a width solves a pair count when every seed's test accuracy reaches this
RULE = (
    "a width solves a pair count when every seed's test accuracy there is >= 90%, and fails it when every seed's is "
    "below. For the LSTM and for the minGRU: shown if at some pair count the GPT's narrowest width solves and every "
    "recurrent width fails, while a recurrent width solves the fewest pairs (the failure comes with the pairs, not "
    "from never learning the task); contradicted if at the most pairs any GPT solves, a recurrent width with no more "
    "bytes of state than that GPT's KV cache solves too. Shown here if shown for both, contradicted here if for "
    "either, otherwise not shown here")


@dataclass(frozen=True)
class MqarBudget(Budget):
    pairs: tuple = (4, 8, 16)  # trained as a log-uniform mix of these counts, tested at each
    keys: int = 16  # distinct keys (and values): at least the most pairs; fewer leave the chance plateau sooner
    widths: tuple = (("gpt", (32,)), ("lstm", (64,)), ("mingru", (64,)))  # each model's widths (2 layers, 1 head)


QUICK = MqarBudget(steps=500, eval_every=50, seeds=3)
BUDGET = dict(quick=QUICK, full=replace(QUICK, widen=2, selection=192, test=512, steps=1000, pairs=(4, 8, 16, 32),
                                        keys=32, widths=(("gpt", (32, 64)), ("lstm", (64, 128)),
                                                         ("mingru", (64, 128)))))


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
    """The choice on the selection sets: the most seeds solving every pair count, then (all solving) the fewest
    steps, else the best mean selection accuracy."""
    solved = sum(run.solved for run in runs)
    return solved, -sum(run.steps for run in runs) if solved == len(runs) else sum(run.select for run in runs)


def mqar_status(points, pairs, name):
    """(status, why) of RULE for one recurrent model against the GPT."""
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
    """(evidence, status) by RULE for every recurrent model among points."""
    rivals = [name for name in RECURRENT if any(p.name == name for p in points)]
    found = {name: mqar_status(points, pairs, name) for name in rivals}
    evidence = "; ".join(f"{LABELS[name]}: {why} ({status})" for name, (status, why) in found.items())
    return evidence, combined([status for status, _ in found.values()])


def accuracy_cell(points, name, n):
    """Each width's test accuracy at n pairs (min-max over seeds) and its bytes of state there."""
    return "; ".join(f"{p.width}: {percent_range(p.test[n])} ({p.bytes[n]:,} B)" for p in points if p.name == name)


def exp_mqar(ctx):
    """Each query asks for the value its key had: each model at each of its widths, at its best recipe; accuracy
    against the number of pairs and against bytes of state."""
    b = BUDGET[ctx.preset]
    pairs, keys, widths = b.pairs, b.keys, dict(b.widths)
    select = {n: recall_batch(b.selection, n, keys, generator=seeded(100 + n)) for n in pairs}
    test = {n: recall_batch(b.test, n, keys, generator=seeded(200 + n)) for n in pairs}

    def make(it, g):
        return mixed_recall_batch(b.batch, min(pairs), max(pairs), keys, generator=g)

    points, task = [], Task("mqar", make, select, test)
    for name in MODELS:
        for width in widths[name]:
            cfg = ModelConfig(type=name, vocab_size=2 * keys + 1, block_size=3 * max(pairs), n_layer=2, n_head=1,
                              n_embd=width, tie_weights=False)
            trained = train_best(ctx, task, cfg, name, f"width {width}", b, recall_merit, (0.9, 0.99))
            points.append(Point(name, width, trained, {n: state_bytes(cfg, 3 * n) for n in pairs},
                                {n: [run.test[n] for run in trained.runs] for n in pairs}))
    detail = ("2-layer GPT (1 head), LSTM and minGRU at widths " + "; ".join(
        f"{LABELS[n]} {'/'.join(map(str, widths[n]))}" for n in MODELS) + f"; {keys} keys, each batch "
        f"{min(pairs)}-{max(pairs)} pairs (log-uniform), queries right after the pairs; state: the GPT's KV cache "
        f"after 3 x pairs tokens, the LSTM's h and c, the minGRU's h (fp32); " + protocol_text(b))
    mqar_figure(ctx, points, pairs, detail)
    attention_figure(ctx, next(p for p in points if p.name == "gpt").trained.runs[0].model,
                     *recall_batch(1, min(8, max(pairs)), keys, generator=seeded(7)), keys)
    for n in pairs:
        ctx.row("mqar", f"{n} pairs ({3 * n} tokens): test accuracy % by width (bytes of state), min-max over "
                f"{b.seeds} seeds", accuracy_cell(points, "gpt", n), accuracy_cell(points, "lstm", n),
                f"chance (1/pairs) {100 / n:.1f}%", accuracy_cell(points, "mingru", n))
    recipes = {name: "; ".join(f"{p.width}: {p.trained.recipe_text()}" for p in points if p.name == name)
               for name in MODELS}
    seconds = {name: sum(p.trained.seconds for p in points if p.name == name) for name in MODELS}
    ctx.row("mqar", "recipe chosen on the selection sets, by width", recipes["gpt"], recipes["lstm"],
            f"cap {b.steps} steps of {b.batch}; training " + " / ".join(f"{seconds[n]:.0f} s" for n in MODELS)
            + " (every run, GPT / LSTM / minGRU)", recipes["mingru"])
    ctx.verdict("mqar", "c", *mqar_verdict(points, pairs), rule=RULE)


def mqar_figure(ctx, points, pairs, detail):
    """Test accuracy against pairs, and against bytes of state (one line per width: a GPT's moves right as its cache
    grows with the pairs, a recurrent one stays put)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = ("o-", "s--", "^:")
    for p in points:
        rank = [q.width for q in points if q.name == p.name].index(p.width)
        mean = [100 * statistics.mean(p.test[n]) for n in pairs]
        label = f"{LABELS[p.name]} width {p.width}"
        left.fill_between(pairs, [100 * min(p.test[n]) for n in pairs], [100 * max(p.test[n]) for n in pairs],
                          color=COLORS[p.name], alpha=0.15)
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
