"""Scaling in miniature, part of reason (b): the lm experiment's GPT and LSTM (each at its best recipe) and larger
GPTs with the LSTM of each one's parameter count, every run trained by `python train.py` on the lm experiment's
corpus for the same tokens and scored on the val split's second half. Does the LSTM fall behind as the models grow,
as Kaplan et al. 2020 (figure 7) found? Their figure is about near-converged models trained on plenty of data, so the
rule (context.SIZES_RULE) decides only at KAPLAN_TOKENS_PER_PARAM training tokens per parameter or more; below that,
the rows are a measurement and the verdict says the regime was not reached.

Protocol: the smallest size is the lm experiment's pair, its runs reused (each model's best recipe, chosen on the val
split's 1st half, every seed); each larger size takes its model's recipe with the AdamW part's lr scaled as muP
predicts (Yang et al. 2022: x the smaller width / this width) and muon_lr as it is, not tuned again.
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
from scripts.report import RUNS, lm
from scripts.report.context import KAPLAN_TOKENS_PER_PARAM, SIZES_RULE, sizes_status
from scripts.report.protocol import mean_range
from scripts.report.tasks import rnn_width

# gpt: (n_layer, n_head, n_embd) of each size above the lm experiment's, smallest first (the LSTM at each is
# configs/model/lstm.yaml at the width of the same parameter count); seeds: the seeds each of them is trained with.
# Runs: 2 x len(gpt) x seeds, each a train.py start-up, its training (the lm experiment's steps) and the scoring.
BUDGET = {
    "quick": dict(gpt=[(2, 4, 128)], seeds=1),
    "full": dict(gpt=[(4, 4, 128), (4, 4, 192)], seeds=1),
}


def exp_sizes(ctx):
    """Test loss against parameters and training FLOPs for both models at equal tokens; the gap against size."""
    shutil.rmtree(RUNS / "sizes", ignore_errors=True)
    result, budget = lm.lm_results(ctx), BUDGET[ctx.preset]
    ladder = size_ladder(ctx, budget, result)
    runs = {name: [result.runs(name)] for name in lm.NAMES}
    for name in lm.NAMES:
        for size in ladder[name][1:]:
            recipe = scaled_recipe(result.tuned[name].recipe, ladder[name][0]["width"], size["width"])
            runs[name].append([lm.lm_run(ctx, result.plan, "sizes", size["model"], f"params={size['model'].params}",
                                         recipe, seed) for seed in range(budget["seeds"])])
    sizes_rows(ctx, result, ladder, runs)
    sizes_figure(ctx, result, ladder, runs)


def size_ladder(ctx, budget, result):
    """Each model's sizes, the lm experiment's first: {name: [dict(model (an lm.LMModel), width, flops)]}, the LSTM
    at each size of the width whose parameter count is closest to the GPT's."""
    data = ["data=text", f"data.path={ctx.data_path}"] if ctx.data_path else []
    T, vocab = result.plan.block_size, result.vocab
    shape = [f"model.block_size={T}"]
    lstm_base = replace(compose("model=lstm", *shape).model, vocab_size=vocab)
    ladder = {name: [size_entry(result.models[name], vocab, result.plan.tokens)] for name in lm.NAMES}
    for n_layer, n_head, n_embd in budget["gpt"]:
        gpt = [f"model.n_layer={n_layer}", f"model.n_head={n_head}", f"model.n_embd={n_embd}"]
        params = build_model(replace(compose(*gpt, *shape).model, vocab_size=vocab)).num_params()
        width = rnn_width(params, vocab, lstm_base.n_layer, tied=lstm_base.tie_weights)
        lstm_params = build_model(replace(lstm_base, n_embd=width)).num_params()
        for model in (lm.LMModel("gpt", [*gpt, *shape, *data], f"{n_layer}x{n_embd} GPT, {n_head} heads", n_layer,
                                 params),
                      lm.LMModel("lstm", ["model=lstm", f"model.n_embd={width}", *shape, *data],
                                 f"{lstm_base.n_layer}x{width} LSTM", lstm_base.n_layer, lstm_params)):
            ladder[model.name].append(size_entry(model, vocab, result.plan.tokens))
    return ladder


def size_entry(model, vocab, tokens):
    built = build_model(replace(compose(*model.overrides).model, vocab_size=vocab))
    return dict(model=model, width=built.config.n_embd, flops=train_flops(built, tokens))


def scaled_recipe(recipe, small, large):
    """The smallest size's recipe at width large (small: the smallest size's width): the AdamW part's lr x small /
    large (muP's prediction for Adam), muon_lr as it is."""
    return replace(recipe, lr=float(f"{recipe.lr * small / large:.3g}"))


def train_flops(model, tokens):
    """6 x the matmul weights per token (the non-embedding parameters, plus a tied head, which num_params skips as the
    embedding but whose matmul runs), plus the GPT's attention, QK^T and AV over the causal half of the keys: 2 x 2 x
    n_embd x T/2 multiply-adds forward per layer and token, x3 with the backward pass."""
    cfg = model.config
    weights = model.num_params(embeddings=False) + (model.lm_head.weight.numel() if cfg.tie_weights else 0)
    attention = 6 * cfg.n_layer * cfg.block_size * cfg.n_embd if hasattr(cfg, "n_head") else 0
    return tokens * (6 * weights + attention)


def sizes_rows(ctx, result, ladder, runs):
    plan = result.plan
    def described(name):
        return (" / ".join(s["model"].desc for s in ladder[name]) + " ("
                + " / ".join(f"{s['model'].params:,}" for s in ladder[name]) + " params)")
    ctx.row("sizes", "models, smallest to largest", described("gpt"), described("lstm"),
            f"corpus {result.corpus}; context {plan.block_size}; {plan.steps} steps x {plan.batch_size} sequences = "
            f"{plan.tokens / 1e6:.2f}M tokens for every run; train.py, fp32, warmup + cosine to lr/10; each LSTM the "
            f"width of its GPT's parameter count")
    def recipes(name):
        return " / ".join(str(rs[0].recipe) for rs in runs[name])
    ctx.row("sizes", "test loss by size, final weights", *(" / ".join(mean_range(lm.test_losses(rs)) for rs in runs[n])
                                                           for n in lm.NAMES),
            f"the smallest size is the lm experiment's, its runs reused (seeds {lm.seeds_range(result)}); larger "
            f"sizes seed{'s' if len(runs['gpt'][-1]) > 1 else ''} {', '.join(str(r.seed) for r in runs['gpt'][-1])}; "
            f"recipes by size: gpt {recipes('gpt')}; lstm {recipes('lstm')} (the AdamW part's lr scaled as muP "
            f"predicts, not tuned again); the test loss on the val split's 2nd half; {lm.ngram_note(result.ngram)}")
    tokens_per_param = [plan.tokens / max(s["model"].params for s in pair) for pair in zip(ladder["gpt"],
                                                                                           ladder["lstm"])]
    ctx.row("sizes", "training tokens per parameter, by size", " / ".join(f"{t:.2g}" for t in tokens_per_param), "-",
            f"Kaplan et al.'s figure 7 is about near-converged models on plenty of data; this rule decides from "
            f"{KAPLAN_TOKENS_PER_PARAM} tokens per parameter at 3 or more sizes with 3 seeds each")
    gaps = [[lstm.test - gpt.test for gpt, lstm in zip(g, s)] for g, s in zip(runs["gpt"], runs["lstm"])]
    status = sizes_status(tokens_per_param, [len(rs) for rs in runs["gpt"]], gaps)
    evidence = (f"at equal tokens ({plan.tokens / 1e6:.2f}M) the LSTM's test loss minus the GPT's is "
                + " / ".join(mean_range(g) for g in gaps) + " nats from "
                + f"{ladder['gpt'][0]['model'].params:,} to {ladder['gpt'][-1]['model'].params:,} params, at "
                + " / ".join(f"{t:.2g}" for t in tokens_per_param) + " training tokens per parameter")
    ctx.row("sizes", "gap, LSTM - GPT test loss, by size", " / ".join(mean_range(g) for g in gaps), "-",
            f"{evidence}; so the LSTM falling behind as models grow (Kaplan et al. 2020, fig. 7) is {status}")
    ctx.row("sizes", "training FLOPs per run, by size",
            *(" / ".join(f"{s['flops']:.2e}" for s in ladder[n]) for n in lm.NAMES),
            "6 x (non-embedding params + the output head) x tokens, plus for the GPT 6 x n_layer x T x n_embd per "
            "token (attention over the causal half of the keys)")
    ctx.verdict("sizes", "b", evidence, status, rule=SIZES_RULE)


def sizes_figure(ctx, result, ladder, runs):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in zip(axes, ("params", "flops"), ("parameters", "training FLOPs (see the rows)")):
        for name, color in (("gpt", "C0"), ("lstm", "C1")):
            xs = [s["model"].params if key == "params" else s["flops"] for s in ladder[name]]
            losses = [lm.test_losses(rs) for rs in runs[name]]
            means = [np.mean(v) for v in losses]
            ax.errorbar(xs, means, yerr=([m - min(v) for m, v in zip(means, losses)],
                                         [max(v) - m for m, v in zip(means, losses)]), fmt="o-", capsize=4,
                        color=color, label=f"{name} (seed min-max)")
        for n, ls in ((2, "--"), (3, ":")):
            ax.axhline(result.ngram[n][1], color="gray", ls=ls, lw=1, label=f"{'bi' if n == 2 else 'tri'}gram (add-k)")
        ax.set_xscale("log")
        ax.minorticks_off()  # log-axis minor labels overlap over a decade
        ax.set(xlabel=label, ylabel="test loss (nats/token, val 2nd half)")
        ax.legend(fontsize=7)
    axes[0].set_title("equal tokens: loss against size")
    axes[1].set_title("loss against training compute")
    plan = result.plan
    ctx.save(fig, "sizes.png", f"corpus {result.corpus}; GPT " + ", ".join(s["model"].desc.split()[0] for s in
             ladder["gpt"]) + " vs LSTM of equal params (" + ", ".join(s["model"].desc.split()[0] for s in
             ladder["lstm"]) + f");\ncontext {plan.block_size}, {plan.steps} steps x {plan.batch_size} sequences "
             f"each, fp32; the smallest size's recipes (the lm experiment's) carried up, the AdamW part's lr scaled "
             f"as muP predicts")
