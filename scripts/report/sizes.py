"""Scaling in miniature: GPTs of three or four sizes against the LSTM of each one's parameter count, every run trained
by `python train.py` on the lm experiment's corpus for the same tokens, scored on the val split's second half. Does
the LSTM fall behind as the models grow, as Kaplan et al. 2020 (figure 7) found?

Protocol: the lr of each model is chosen on the val split's first half (the report's seed_grid, which widens past a
winning end) at the smallest size from the budget's grid, and at each larger one from a grid around muP's prediction
(Yang et al. 2022), the smaller size's choice x its width / this width: x1/2, x1, x2 in the full preset, since the
best lr moves with width differently for each model (docs/log.md); the quick preset takes the prediction as it is.
One seed per size, plus the chosen lr's seeds 1 and 2 at the smallest size for the seed spread.
Training FLOPs count 6 x the matmul weights (the non-embedding parameters plus the output head, whose matmul runs)
per token, plus, for the GPT, 6 x n_layer x T x n_embd per token for QK^T and AV over the causal half of the keys.
    python -m scripts.report --only sizes
"""
import shutil
from dataclasses import replace

import matplotlib.pyplot as plt
import numpy as np

from attnlab.checkpoint import build_model
from attnlab.config import compose
from data.corpus import load_meta, prepare
from scripts.report import RUNS, lm
from scripts.report.protocol import seed_grid
from scripts.report.tasks import rnn_width

# gpt: (n_layer, n_head, n_embd) per size, smallest first (the LSTM at each is configs/model/lstm.yaml at the width of
# the same parameter count); block_size, batch_size, steps: the same for every run, so every run sees the same tokens;
# lrs: each model's AdamW grid at the smallest size (centred on the lm experiment's choices); retune: each larger
# size's grid as factors of muP's prediction; seeds: those the chosen lr is trained with at the smallest size; evals,
# eval_iters: train.py's val estimates per run and batches per estimate; select_windows, test_windows: windows scored
# on each val half (None: all).
# Sized by steps x one measured step (2,048 tokens) plus train.py's start-up, for 12 runs (quick, 2 sizes) and about 28
# (full, 3 sizes at 1.02M tokens a run, the largest pair's grid most of it); docs/report.md has the wall times.
BUDGET = {
    "quick": dict(gpt=[(2, 2, 48), (2, 4, 144)], block_size=256, batch_size=8, steps=200,
                  lrs=dict(gpt=[6e-3, 1.2e-2, 2.4e-2], lstm=[1e-2, 2e-2, 4e-2]), retune=(1,), seeds=3, evals=4,
                  eval_iters=2, select_windows=128, test_windows=256),
    "full": dict(gpt=[(2, 2, 64), (3, 4, 128), (4, 4, 192)], block_size=256, batch_size=8, steps=500,
                 lrs=dict(gpt=[3e-3, 6e-3, 1.2e-2], lstm=[5e-3, 1e-2, 2e-2]), retune=(0.5, 1, 2), seeds=3, evals=4,
                 eval_iters=2, select_windows=256, test_windows=None),
}


def exp_sizes(ctx):
    """Test loss against parameters and training FLOPs for both models at equal tokens; the gap against size."""
    shutil.rmtree(RUNS / "sizes", ignore_errors=True)
    budget = BUDGET[ctx.preset]
    data_dir, ladder = models(ctx, budget)
    runs = {}
    for name in ("gpt", "lstm"):
        runs[name] = dict(tuned=[], by_size=[])
        for i, size in enumerate(ladder[name]):
            if i == 0:  # the seed spread is measured at the smallest size
                grid, seeds = budget["lrs"][name], list(range(budget["seeds"]))
            else:  # muP-style: Adam's per-weight step shrinks with the width
                predicted = runs[name]["tuned"][-1]["lr"] * ladder[name][i - 1]["width"] / size["width"]
                grid, seeds = [float(f"{predicted * f:.3g}") for f in budget["retune"]], [0]
            best, lrs, _, chosen = seed_grid(lambda lr, seed: fit(ctx, budget, data_dir, size, lr, seed), grid, seeds,
                                             1, lambda rs: -np.mean([r["select"] for r in rs]))
            runs[name]["tuned"].append(dict(lr=best, lrs=lrs, edge=len(lrs) > 1 and best in (min(lrs), max(lrs))))
            runs[name]["by_size"].append(chosen[0])
            if i == 0:
                runs[name]["seeds"] = list(chosen.values())
    references = lm.ngram_baselines(data_dir, load_meta(data_dir)["vocab_size"])  # {n: (k, test loss)}
    sizes_rows(ctx, budget, ladder, runs, references)
    sizes_figure(ctx, budget, ladder, runs, references)


def models(ctx, budget):
    """The prepared corpus and each model's ladder of sizes: {name: [dict(overrides, desc, params, width, flops)]},
    the LSTM at each size of the width whose parameter count is closest to the GPT's."""
    data = ["data=text", f"data.path={ctx.data_path}"] if ctx.data_path else []
    T = budget["block_size"]
    shape = [f"model.block_size={T}"]
    base = compose(*shape, *data)
    data_dir = prepare(base.data, T)
    vocab = load_meta(data_dir)["vocab_size"]
    lstm_base = replace(compose("model=lstm", *shape).model, vocab_size=vocab)
    tokens = budget["steps"] * budget["batch_size"] * T
    ladder = {"gpt": [], "lstm": []}
    for n_layer, n_head, n_embd in budget["gpt"]:
        gpt = [f"model.n_layer={n_layer}", f"model.n_head={n_head}", f"model.n_embd={n_embd}"]
        model = build_model(replace(compose(*gpt, *shape).model, vocab_size=vocab))
        width = rnn_width(model.num_params(), vocab, lstm_base.n_layer, tied=lstm_base.tie_weights)
        rnn = build_model(replace(lstm_base, n_embd=width))
        for name, m, overrides, desc in (("gpt", model, gpt, f"{n_layer}x{n_embd} GPT"),
                                         ("lstm", rnn, ["model=lstm", f"model.n_embd={width}"],
                                          f"{lstm_base.n_layer}x{width} LSTM")):
            ladder[name].append(dict(name=name, overrides=[*overrides, *shape, *data], desc=desc,
                                     params=m.num_params(), width=m.config.n_embd, flops=train_flops(m, tokens)))
    return data_dir, ladder


def train_flops(model, tokens):
    """6 x the matmul weights per token (the non-embedding parameters, plus a tied head, which num_params skips as the
    embedding but whose matmul runs), plus the GPT's attention, QK^T and AV over the causal half of the keys: 2 x 2 x
    n_embd x T/2 multiply-adds forward per layer and token, x3 with the backward pass."""
    cfg = model.config
    weights = model.num_params(embeddings=False) + (model.lm_head.weight.numel() if cfg.tie_weights else 0)
    attention = 6 * cfg.n_layer * cfg.block_size * cfg.n_embd if hasattr(cfg, "n_head") else 0
    return tokens * (6 * weights + attention)


def fit(ctx, budget, data_dir, model, lr, seed):
    """One size of one model trained and scored as the lm experiment's runs are (lm.fit: train.py, fp32, AdamW,
    warmup + cosine to lr/10; selection loss on the val split's 1st half, test loss on its 2nd), at this budget."""
    shared = dict(steps=budget["steps"], batch_size=budget["batch_size"], block_size=budget["block_size"],
                  data_dir=str(data_dir), **{model["name"]: dict(overrides=model["overrides"])})
    return lm.fit(ctx, shared, "sizes", model["name"], f"params={model['params']}", [], lr, seed, budget=budget)


def retuned(budget):
    """How a larger size's lr was found, in words."""
    muP = "muP's prediction (the smaller size's lr x its width / this width)"
    if tuple(budget["retune"]) == (1,):
        return f"each larger size at {muP}, not re-tuned"
    factors = ", ".join(f"x{f:g}" for f in budget["retune"])
    return f"each larger size's from {factors} {muP}, widened while its best is at an end"


def seed_range(runs):
    """Min-max of the runs' test losses: (low, high)."""
    tests = [r["test"] for r in runs]
    return min(tests), max(tests)


def decide(gaps, spread):
    """The verdict on reason (b) from the gap (LSTM - GPT test loss) at the smallest and the largest size: it grows
    by more than the seed spread (shown), shrinks by more (contradicted), or neither (not shown)."""
    change = gaps[-1] - gaps[0]
    if change > spread:
        return "shown here"
    if change < -spread:
        return "contradicted here"
    return "not shown here"


def sizes_rows(ctx, budget, ladder, runs, references):
    T, steps, batch = budget["block_size"], budget["steps"], budget["batch_size"]
    tokens = steps * batch * T
    def described(name):
        return (" / ".join(m["desc"] for m in ladder[name]) + " ("
                + " / ".join(f"{m['params']:,}" for m in ladder[name]) + " params)")
    ctx.row("sizes", "models, smallest to largest", described("gpt"), described("lstm"),
            f"corpus {lm.corpus_name(ctx)}; context {T}; {steps} steps x {batch} sequences = {tokens / 1e6:.2f}M "
            f"tokens for every run; train.py, AdamW, fp32, warmup + cosine to lr/10; each LSTM the width of its "
            f"GPT's parameter count")
    def grids(name):
        return " / ".join(f"{t['lr']:g} of [{', '.join(f'{lr:g}' for lr in t['lrs'])}]"
                          + (" (an end of the grid)" if t["edge"] else "") for t in runs[name]["tuned"])
    ctx.row("sizes", "test loss by size, final weights, seed 0",
            " / ".join(f"{r['test']:.3f}" for r in runs["gpt"]["by_size"]),
            " / ".join(f"{r['test']:.3f}" for r in runs["lstm"]["by_size"]),
            f"lr chosen on the val split's 1st half, by size: gpt {grids('gpt')}; lstm {grids('lstm')}; "
            f"{retuned(budget)}; the test loss on the 2nd half; {lm.ngram_note(references)}")
    ranges = {name: seed_range(runs[name]["seeds"]) for name in ("gpt", "lstm")}
    spread = sum(high - low for low, high in ranges.values())
    ctx.row("sizes", f"test loss at the smallest size, seeds {', '.join(str(r['seed']) for r in runs['gpt']['seeds'])}",
            *(f"{np.mean([r['test'] for r in runs[n]['seeds']]):.3f} (min-max {ranges[n][0]:.3f}-{ranges[n][1]:.3f})"
              for n in ("gpt", "lstm")),
            f"the spread a gap can have from seeds alone: the two ranges summed, {spread:.3f} nats")
    gaps = [lstm["test"] - gpt["test"] for gpt, lstm in zip(runs["gpt"]["by_size"], runs["lstm"]["by_size"])]
    status = decide(gaps, spread)
    evidence = (f"at equal tokens ({tokens / 1e6:.2f}M) the LSTM's test loss minus the GPT's is {gaps[0]:+.3f} nats "
                f"at {ladder['gpt'][0]['params']:,} params and {gaps[-1]:+.3f} at {ladder['gpt'][-1]['params']:,}: "
                f"a change of {gaps[-1] - gaps[0]:+.3f} against a seed spread of {spread:.3f}")
    ctx.row("sizes", "gap, LSTM - GPT test loss, smallest / largest size", f"{gaps[0]:+.3f} / {gaps[-1]:+.3f}", "-",
            f"{evidence}; so the LSTM falling behind as models grow (Kaplan et al. 2020, fig. 7) is {status}")
    ctx.row("sizes", "training FLOPs per run, smallest / largest size",
            *(f"{ladder[n][0]['flops']:.2e} / {ladder[n][-1]['flops']:.2e}" for n in ("gpt", "lstm")),
            "6 x (non-embedding params + the output head) x tokens, plus for the GPT 6 x n_layer x T x n_embd per "
            "token (attention over the causal half of the keys)")
    ctx.verdict("sizes", "b", evidence, status)


def sizes_figure(ctx, budget, ladder, runs, references):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in zip(axes, ("params", "flops"), ("parameters", "training FLOPs (see the rows)")):
        for name, color in (("gpt", "C0"), ("lstm", "C1")):
            xs = [m[key] for m in ladder[name]]
            ax.semilogx(xs, [r["test"] for r in runs[name]["by_size"]], "o-", color=color, label=name)
            low, high = seed_range(runs[name]["seeds"])
            ax.errorbar(xs[0] * 0.93, (low + high) / 2, yerr=(high - low) / 2, fmt="none", capsize=4, color=color,
                        label=f"{name}: {len(runs[name]['seeds'])} seeds' min-max")
        for n, ls in ((2, "--"), (3, ":")):
            ax.axhline(references[n][1], color="gray", ls=ls, lw=1, label=f"{'bi' if n == 2 else 'tri'}gram (add-k)")
        ax.minorticks_off()  # log-axis minor labels overlap over a decade
        ax.set(xlabel=label, ylabel="test loss (nats/token, val 2nd half)")
        ax.legend(fontsize=7)
    axes[0].set_title("equal tokens: loss against size")
    axes[1].set_title("loss against training compute")
    T, steps, batch = budget["block_size"], budget["steps"], budget["batch_size"]
    ctx.save(fig, "sizes.png", f"corpus {lm.corpus_name(ctx)}; GPT " + ", ".join(m["desc"].split()[0] for m in
             ladder["gpt"]) + " vs LSTM of equal params (" + ", ".join(m["desc"].split()[0] for m in ladder["lstm"])
             + f");\ncontext {T}, {steps} steps x {batch} sequences each, AdamW fp32, seed 0 per size; lr chosen at "
             f"the smallest size,\n{retuned(budget)}")
