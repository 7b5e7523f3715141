"""Recall and induction: can the model look a value up, or copy a repeat, from anywhere in its context? Both models
go through the same grid (scripts/report/tasks.py's tune): equal step cap, batch and schedule, an lr grid per model
chosen on a selection set, two seeds at the chosen lr, and accuracy read on a separate test set."""
import textwrap
from dataclasses import replace

import matplotlib.pyplot as plt
import torch

from scripts.report.tasks import induction_batch, mixed_recall_batch, recall_batch, state_bytes, synthetic_models, tune

PAIRS = (4, 8, 16, 32, 64)  # recall is trained on 4..64 pairs at once and tested at each of these
SHOWN = (4, 16, 64)  # the pairs the results table reports; the last two also for the narrowest width at 90%
N_KEYS = 64  # distinct keys (and values) per task: enough for 64 pairs
SEEDS = (0, 1)  # the chosen lr runs with every seed; the spread over them is reported
BUDGET = {  # what the experiments may spend; both models always get the same cap, batch and schedule
    "quick": dict(
        batch=32,  # sequences per training step
        recall_steps=600,  # the step cap of every recall run (warmup + cosine to it)
        induction_steps=1000,  # the step cap of every induction run (the LSTM still rises slowly at 1000)
        lrs={"gpt": (1e-2, 3e-2, 1e-1), "lstm": (3e-3, 1e-2, 3e-2)},  # the grid, at the reference widths
        widths={"gpt": (32,), "lstm": (154,)},  # recall's other widths (reference: 64 and 77), at the chosen lr
        grid_seeds=1,  # seeds per grid point; the chosen lr then runs the rest of SEEDS
        selection=96,  # sequences per selection set (recall: per number of pairs), scored every eval_every steps
        test=256,  # sequences per test set (recall: per number of pairs), scored once per run
    ),
    "full": dict(batch=32, recall_steps=2000, induction_steps=3000, lrs={"gpt": (3e-3, 1e-2, 3e-2, 1e-1),
                 "lstm": (1e-3, 3e-3, 1e-2, 3e-2)}, widths={"gpt": (32, 128), "lstm": (38, 154)}, grid_seeds=1,
                 selection=192, test=512),
}
TRAIN = dict(eval_every=50, patience=4, stop_at=0.995)  # train_synthetic's stopping rule, stated in every figure


def seeded(seed):
    return torch.Generator().manual_seed(seed)


def save(ctx, fig, name, detail):
    """ctx.save with the detail wrapped to the figure's width, so a long protocol line does not widen the PNG."""
    ctx.save(fig, name, textwrap.fill(detail, int(20 * fig.get_figwidth())))


def spread(values, digits=0):
    """Percentages over seeds as 'min-max', or one number when they agree to the last digit shown."""
    low, high = f"{100 * min(values):.{digits}f}", f"{100 * max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def protocol(b, steps):
    """The training and selection protocol in one sentence, for the figures' detail lines."""
    grid = ", ".join(f"{name} {'/'.join(f'{lr:g}' for lr in b['lrs'][name])}" for name in ("gpt", "lstm"))
    grid_seeds = ", ".join(map(str, SEEDS[:b["grid_seeds"]]))
    return (f"both models: batch {b['batch']}, at most {steps} steps (warmup + cosine to the cap), scored every "
            f"{TRAIN['eval_every']}, stopped at {100 * TRAIN['stop_at']:g}% on every selection set or, past half the "
            f"cap, once the selection loss has not fallen 1% in {TRAIN['patience']} scores; lr grid {grid} with seed "
            f"{grid_seeds}, the lr best on the selection set run with seeds {', '.join(map(str, SEEDS))}; test-set "
            f"accuracy, min-max over seeds")


def grid_note(tuned):
    """The chosen lrs, where each sits in its grid, and any run the cap stopped while it was still improving."""
    notes = [f"lr {tuned['gpt'].lr:g} / {tuned['lstm'].lr:g}"]
    notes += [f"{name} lr at the grid's edge" for name in ("gpt", "lstm") if tuned[name].edge]
    notes += [f"{name}: {sum(r.capped for r in tuned[name].runs.values())} of {len(SEEDS)} seeds hit the cap still "
              f"improving" for name in ("gpt", "lstm") if any(r.capped for r in tuned[name].runs.values())]
    return "; ".join(notes)


def exp_recall(ctx):
    """Multi-query associative recall, 4 to 64 pairs: each query asks for the value its key had. Accuracy against the
    bytes of state a model keeps per sequence shows what attention's growing cache buys over a fixed-size state."""
    b = BUDGET[ctx.preset]
    configs = synthetic_models(2 * N_KEYS + 1, 3 * max(PAIRS))
    select = {n: recall_batch(b["selection"], n, N_KEYS, generator=seeded(100 + n)) for n in PAIRS}
    test = {n: recall_batch(b["test"], n, N_KEYS, generator=seeded(200 + n)) for n in PAIRS}
    def make(it, g):
        return mixed_recall_batch(b["batch"], min(PAIRS), max(PAIRS), N_KEYS, generator=g)
    def fit(name, cfg, lrs, grid_seeds):
        return tune(ctx, "recall", name, cfg, make, lrs, SEEDS, b["recall_steps"],
                                                      select, test, f"width {cfg.n_embd}", grid_seeds, **TRAIN)
    tuned, sizes = {}, {}  # sizes[name, width]: (config, Tuned)
    for name, cfg in configs.items():
        tuned[name] = fit(name, cfg, b["lrs"][name], b["grid_seeds"])
        sizes[name, cfg.n_embd] = cfg, tuned[name]
        for width in b["widths"][name]:
            wider = replace(cfg, n_embd=width)
            sizes[name, width] = wider, fit(name, wider, [tuned[name].lr], len(SEEDS))
    def scores(t, n):
        return [run.test[n] for run in t.runs.values()]
    n_params = {name: tuned[name].runs[0].model.num_params() for name in configs}
    detail = (f"2-layer GPT (width {configs['gpt'].n_embd}, {n_params['gpt']:,} params) vs 2-layer LSTM "
              f"(width {configs['lstm'].n_embd}, {n_params['lstm']:,}); {N_KEYS} keys, each batch {min(PAIRS)}-"
              f"{max(PAIRS)} pairs (log-uniform); " + protocol(b, b["recall_steps"]))
    recall_figure(ctx, tuned, scores, detail)
    others = ", ".join(f"{name} {'/'.join(map(str, b['widths'][name]))}" for name in configs)
    state_figure(ctx, sizes, scores, f"{detail}; other widths at the chosen lr, every seed: {others}")
    attention_figure(ctx, tuned["gpt"].runs[0].model, *recall_batch(1, 8, N_KEYS, generator=seeded(7)), 8)
    def every_run(name):
        return [run for (model, _), (_, t) in sizes.items() if model == name for run in t.runs.values()]
    seconds = {name: sum(t.seconds for (model, _), (_, t) in sizes.items() if model == name) for name in configs}
    ctx.row("recall", f"MQAR accuracy % at {' / '.join(map(str, SHOWN))} pairs (test; min-max over {len(SEEDS)} seeds)",
            *(" / ".join(spread(scores(tuned[name], n)) for n in SHOWN) for name in configs),
            f"equal size ({n_params['gpt']:,} vs {n_params['lstm']:,} params); chance (1/pairs) "
            f"{' / '.join(f'{100 / n:.1f}' for n in SHOWN)}; {grid_note(tuned)}; at most {b['recall_steps']} steps of "
            f"{b['batch']}; {seconds['gpt']:.0f} s / {seconds['lstm']:.0f} s of training, every run of every width")

    def smallest(name, n):  # the narrowest width whose every seed reaches 90% at n pairs
        good = sorted(width for (model, width), (_, t) in sizes.items() if model == name and min(scores(t, n)) >= 0.9)
        return f"{good[0]} ({state_bytes(sizes[name, good[0]][0], 3 * n):,} B)" if good else "-"

    capped = {name: sum(run.capped for run in every_run(name)) for name in configs}
    ctx.row("recall", f"narrowest width (bytes of state) with >= 90% at {SHOWN[1]} / {SHOWN[2]} pairs, every seed",
            *(f"{smallest(name, SHOWN[1])} / {smallest(name, SHOWN[2])}" for name in configs),
            f"widths tried: GPT {sorted(w for m, w in sizes if m == 'gpt')}, LSTM "
            f"{sorted(w for m, w in sizes if m == 'lstm')}; state: KV cache at 3 x pairs tokens vs h and c; runs "
            f"at the chosen lr capped while improving: {capped['gpt']} / {capped['lstm']}")


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
          "(faint: seed 1)", ylim=(0, 102))
    for ax in (a, b):
        ax.legend(fontsize=8)
    save(ctx, fig, "recall.png", detail)


def state_figure(ctx, sizes, scores, detail):
    """Accuracy against bytes of state: a GPT's state grows with the context it reads, an LSTM's with its width."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, n in enumerate(PAIRS):
        for name, style in (("gpt", "o-"), ("lstm", "s--")):
            points = sorted((state_bytes(cfg, 3 * n), [100 * a for a in scores(t, n)])
                            for (model, _), (cfg, t) in sizes.items() if model == name)
            mean = [sum(a) / len(a) for _, a in points]
            bars = [[m - min(a) for m, (_, a) in zip(mean, points)], [max(a) - m for m, (_, a) in zip(mean, points)]]
            ax.errorbar([x for x, _ in points], mean, yerr=bars, fmt=style, color=f"C{i}", capsize=2,
                        label=f"{n} pairs" if name == "gpt" else None)
        ax.axhline(100 / n, color=f"C{i}", lw=0.6, ls=":")
    def widths(name):
        return "/".join(str(w) for model, w in sorted(sizes) if model == name)
    ax.plot([], [], "ko-", label=f"GPT, widths {widths('gpt')}")
    ax.plot([], [], "ks--", label=f"LSTM, widths {widths('lstm')}")
    ax.set_xscale("log")
    ax.set(xlabel="bytes of state per sequence, fp32 (GPT: KV cache after 3 x pairs tokens; LSTM: h and c)",
           ylabel="test query accuracy (%)", ylim=(0, 102),
           title="recall against state size (a marker per width, bars min-max over seeds; dotted: chance)")
    ax.legend(fontsize=7)
    save(ctx, fig, "recall_state.png", detail)


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
    test = {"second copy": induction_batch(b["test"], generator=seeded(400))[:2]}
    def make(it, g):
        return induction_batch(b["batch"], generator=g)[:2]
    tuned = {name: tune(ctx, "induction", name, cfg, make, b["lrs"][name], SEEDS, b["induction_steps"], select, test,
                        f"width {cfg.n_embd}", b["grid_seeds"], **TRAIN) for name, cfg in configs.items()}
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
    axes[0].set(xlabel="training step", ylabel="selection accuracy on the second copy (%)",
                title="copying a repeat (faint: seed 1)", ylim=(0, 102))
    axes[0].legend(fontsize=8)
    example = int((lengths == 24).nonzero()[0, 0]) if (lengths == 24).any() else 0
    for layer, ax in enumerate(axes[1:]):
        ax.imshow(maps[layer][example, 0].cpu().numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set(xlabel="attended position", ylabel="position", title=(
            f"layer 1: previous token ({100 * prev:.0f}% of weight)" if layer == 0 else
            f"layer 2: induction stripe ({100 * induct:.0f}% of weight)"))
    n_params = {name: tuned[name].runs[0].model.num_params() for name in configs}
    steps = {name: " / ".join(str(run.steps) for run in tuned[name].runs.values()) for name in configs}
    save(ctx, fig, "induction.png", f"2-layer GPT ({n_params['gpt']:,} params) vs 2-layer LSTM "
         f"({n_params['lstm']:,}); segments of 8-32 distinct tokens out of 32; {protocol(b, b['induction_steps'])}; "
         f"steps per seed GPT {steps['gpt']}, LSTM {steps['lstm']}; maps: seed 0, one sequence with a "
         f"{int(lengths[example])}-token segment")
    ctx.row("induction", f"accuracy % on the repeated half (test; min-max over {len(SEEDS)} seeds)",
            *(spread([run.test["second copy"] for run in tuned[name].runs.values()], 1) for name in configs),
            f"{grid_note(tuned)}; steps per seed {steps['gpt']} / {steps['lstm']} of at most {b['induction_steps']} "
            f"(batch {b['batch']}); {tuned['gpt'].seconds:.0f} s / {tuned['lstm'].seconds:.0f} s of training")
    ctx.row("induction", "GPT attention: layer 1 on the previous token / layer 2 on the induction target",
            f"{100 * prev:.0f}% / {100 * induct:.0f}%", "", "seed 0, averaged over the second copy of 256 sequences")
