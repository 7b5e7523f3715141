"""Reason (b)'s loss part in the data-rich regime, a small Kaplan et al. (2020) figure 7: the GPT against the LSTM of
its parameter count at three sizes, every run trained by train.py to TOKENS_PER_PARAM tokens per parameter (Hoffmann
et al. 2022), each model at each size at its own Muon recipe (tune_size), 3 seeds. The runs are saved (RESULT) for
the context experiment, which reads the largest pair. `python -m scripts.report --only sizes`
"""
import math
import shutil
import statistics
from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
import numpy as np

from attnlab.checkpoint import build_model, load_model
from attnlab.config import compose
from data.corpus import load_split
from scripts.report import RUNS, lm
from scripts.report.protocol import Recipe, apart, mean_range, tune

TOKENS_PER_PARAM = 20  # training tokens per parameter of every run: the data-rich regime the rule is about
LOSS_MATERIAL = 0.02  # nats: at losses near 1.5 about what 1.3x the compute buys on Kaplan et al.'s L ∝ C^-0.050
RULE = (f"at each of 3 sizes both models trained to {TOKENS_PER_PARAM} tokens per parameter, each at its own "
        f"Muon recipe tuned at that size, 3 seeds; a model is ahead at a size where its mean test loss is lower "
        f"by more than {LOSS_MATERIAL} nats (at these losses about what 1.3x the compute buys on Kaplan et al.'s "
        f"compute law) and the seeds' min-max ranges are apart. Shown where the GPT is ahead at the largest size "
        f"and the gap (LSTM - GPT, per seed) grows from the smallest size to the largest, ranges apart; "
        f"contradicted where the LSTM is ahead at the largest size and the gap does not grow; otherwise not "
        f"shown")
RESULT = RUNS / "sizes" / "result.json"  # the last sizes training: one LMResult per size


@dataclass(frozen=True)
class Budget:
    """What the sizes experiment may spend. Runs: 2 models x 3 sizes x (5 grid points, more where widened, + 2
    seeds), each a train.py start-up and training."""
    gpt: tuple = ((2, 2, 20), (2, 2, 28), (2, 2, 40))  # (n_layer, n_head, n_embd) of each size, smallest first
    block_size: int = 512  # every run's context
    batch_size: int = 4  # sequences a step (steps: TOKENS_PER_PARAM x the pair's larger count / tokens a step)
    muon_lrs: tuple = (("gpt", (0.01, 0.02, 0.04)), ("lstm", (0.08, 0.16, 0.32)))  # each model's muon_lr grid
    adamw_lrs: tuple = (("gpt", (0.01, 0.03, 0.1)), ("lstm", (0.03, 0.09, 0.27)))  # its AdamW part's lr grid
    widen: int = 2  # grid steps added past a winning end
    seeds: int = 3  # the chosen recipe's seeds (grid points: seed 0)
    evals: int = 8  # train.py's val estimates a run (the curves against tokens)
    eval_iters: int = 4  # batches each
    select_windows: int | None = 128  # windows of block_size scored on the val split's 1st half (None: all)
    test_windows: int | None = None  # on its 2nd half
    train_windows: int = 128  # on the train split


QUICK = Budget()
BUDGET = dict(quick=QUICK, full=replace(QUICK, gpt=((2, 2, 32), (2, 2, 56), (3, 4, 64)),
                                        muon_lrs=(("gpt", (0.02, 0.04, 0.08)), ("lstm", (0.08, 0.16, 0.32))),
                                        adamw_lrs=(("gpt", (3e-3, 1e-2, 3e-2)), ("lstm", (1e-2, 3e-2, 9e-2))),
                                        select_windows=256, train_windows=256))


def exp_sizes(ctx):
    """Test loss against parameters and training FLOPs at TOKENS_PER_PARAM, and the gap against size."""
    results = train_sizes(ctx)
    sizes_rows(ctx, results)
    sizes_figure(ctx, results)


def train_sizes(ctx):
    """Every size's pair tuned and trained (tune_size): [LMResult], smallest first, saved to RESULT."""
    shutil.rmtree(RUNS / "sizes", ignore_errors=True)
    budget = BUDGET[ctx.preset]
    results = []
    for n_layer, n_head, n_embd in budget.gpt:
        gpt = [f"model.n_layer={n_layer}", f"model.n_head={n_head}", f"model.n_embd={n_embd}"]
        data_dir, vocab, models = lm.pair_models(ctx, gpt, budget.block_size)
        tokens = TOKENS_PER_PARAM * max(m.params for m in models.values())
        plan = lm.Plan.of(data_dir, budget, steps=math.ceil(tokens / (budget.batch_size * budget.block_size)))
        result = lm.LMResult(ctx.preset, lm.corpus_name(ctx), vocab, lm.unigram_entropy(data_dir), plan, models)
        for name, model in models.items():
            result.tuned[name] = tune_size(ctx, budget, plan, model)
            print(f"sizes: {model.desc} ({model.params:,} params): {result.tuned[name].recipe} chosen")
        results.append(result)
    results[0].ngram = lm.ngram_baselines(results[0].plan.data_dir, results[0].vocab)
    lm.save_results(RESULT, results)
    return results


def tune_size(ctx, budget, plan, model):
    """model's muon_lr grid (AdamW part at its grid's middle lr), then the AdamW part's lr grid at the chosen
    muon_lr: the second grid's Tuned (the first in its others), its runs every seed. A recipe trains once."""
    done = {}
    def fit(recipe, seed):
        if (recipe, seed) not in done:
            done[recipe, seed] = lm.lm_run(ctx, plan, "sizes", model, f"params={model.params}", recipe, seed)
        return done[recipe, seed]
    seeds, adamw_lrs = list(range(budget.seeds)), dict(budget.adamw_lrs)[model.name]
    middle = sorted(adamw_lrs)[len(adamw_lrs) // 2]
    muon = tune(fit, lambda m: Recipe("muon", middle, m), dict(budget.muon_lrs)[model.name], seeds[:1],
                lm.selection_merit, widen=budget.widen)
    part = tune(fit, lambda lr: Recipe("muon", lr, muon.recipe.muon_lr), adamw_lrs, seeds, lm.selection_merit,
                widen=budget.widen)
    part.others = [muon]
    return part


def cached_sizes(ctx):
    """The last sizes training's [LMResult] where it is ctx's preset and corpus and its runs are there, else None."""
    return lm.cached_results(RESULT, ctx)


def gaps(result):
    """LSTM - GPT test loss, seed by seed."""
    return [lstm.test - gpt.test for gpt, lstm in zip(result.runs("gpt"), result.runs("lstm"))]


def ahead(result):
    """Which model is ahead at this size by RULE ("gpt", "lstm") or None."""
    losses = {n: lm.test_losses(result.runs(n)) for n in lm.NAMES}
    if abs(statistics.mean(gaps(result))) <= LOSS_MATERIAL:
        return None
    return {-1: "gpt", 1: "lstm", 0: None}[apart(losses["gpt"], losses["lstm"])]


def sizes_status(results):
    """The verdict by RULE from every size's results (smallest first)."""
    regime = [r for r in results if r.plan.tokens >= TOKENS_PER_PARAM * max(m.params for m in r.models.values())
              and len(r.runs("gpt")) >= 3]
    if len(regime) < 3:
        return f"not shown here (fewer than 3 sizes with 3 seeds at {TOKENS_PER_PARAM:g} tokens per parameter)"
    leader, grows = ahead(regime[-1]), apart(gaps(regime[-1]), gaps(regime[0])) == 1
    if leader == "gpt" and grows:
        return "shown here"
    if leader == "lstm" and not grows:
        return "contradicted here"
    return "not shown here"


def train_loss(run, plan, windows):
    """The run's mean loss on windows of the train split: beside its test loss, whether it memorised."""
    tokens = load_split(plan.data_dir, "train")
    return lm.position_losses(load_model(run.out, "latest")[0], tokens, plan.block_size, windows).mean().item()


def sizes_rows(ctx, results):
    budget, first = BUDGET[ctx.preset], results[0]
    train_tokens = len(load_split(first.plan.data_dir, "train"))
    def by_size(f):
        return " / ".join(f(r) for r in results)
    ctx.row("sizes", "models, smallest to largest", *(by_size(lambda r, n=n: f"{r.models[n].desc} "
                                                              f"({r.models[n].params:,})") for n in lm.NAMES),
            f"corpus {first.corpus} ({first.vocab} tokens); context {first.plan.block_size}; {first.plan.batch_size} "
            f"sequences a step; fp32")
    ctx.row("sizes", "training tokens (M) and passes over the train split, by size",
            by_size(lambda r: f"{r.plan.tokens / 1e6:.2f}M, {r.plan.tokens / train_tokens:.2f}"), "the same",
            " / ".join(f"{r.plan.steps:,}" for r in results) + " steps")
    ctx.row("sizes", "each size's recipe (muon_lr grid, then the AdamW part's lr grid)",
            *(by_size(lambda r, n=n: recipe_note(r.tuned[n])) for n in lm.NAMES),
            "seed 0 on the selection half")
    ctx.row("sizes", "test loss by size, final weights",
            *(by_size(lambda r, n=n: mean_range(lm.test_losses(r.runs(n)))) for n in lm.NAMES),
            f"seeds 0-{budget.seeds - 1}; {lm.ngram_note(first.ngram)}; unigram {first.unigram:.3f}")
    largest = results[-1]
    memo = {n: [train_loss(run, largest.plan, budget.train_windows) - run.test for run in largest.runs(n)]
            for n in lm.NAMES}
    ctx.row("sizes", "train minus test loss, largest size", *(mean_range(memo[n]) for n in lm.NAMES),
            f"{budget.train_windows} train windows, per seed")
    ctx.row("sizes", "still improving at the end (of 3 seeds), by size",
            *(by_size(lambda r, n=n: str(sum(run.improving for run in r.runs(n)))) for n in lm.NAMES),
            f"> {lm.PLATEAU_NATS} nats over the last quarter")
    ctx.row("sizes", "training FLOPs per run, by size", *(by_size(lambda r, n=n: f"{flops(r, n):.2e}")
                                                          for n in lm.NAMES),
            "flops_per_token x training tokens")
    status = sizes_status(results)
    evidence = ("gap (LSTM - GPT test loss) by size " + " / ".join(mean_range(gaps(r)) for r in results)
                + " nats at " + " / ".join(f"{r.models['gpt'].params / 1e3:.0f}K" for r in results)
                + f" params, {TOKENS_PER_PARAM} tokens per parameter; ahead at each size: "
                + " / ".join(ahead(r) or "neither" for r in results))
    ctx.row("sizes", "gap, LSTM - GPT test loss, by size", by_size(lambda r: mean_range(gaps(r))), "-",
            f"{evidence}; so attention's better loss as models and data grow is {status}")
    ctx.verdict("sizes", "b", evidence, status, rule=RULE)


def recipe_note(tuned):
    """muon_lr and lr chosen among each grid's points, (edge) where a choice sits at its grid's end."""
    muon = tuned.others[0]
    return (f"muon_lr {tuned.recipe.muon_lr:g} of [{', '.join(f'{x:g}' for x in muon.lrs)}]"
            + (" (edge)" if muon.edge else "") + f", lr {tuned.recipe.lr:g} of ["
            + ", ".join(f"{r.lr:g}" for r, _ in tuned.tried) + "]" + (" (edge)" if tuned.edge else ""))


def flops(result, name):
    model = build_model(replace(compose(*result.models[name].overrides).model, vocab_size=result.vocab))
    return model.flops_per_token(result.plan.block_size) * result.plan.tokens


def sizes_figure(ctx, results):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        losses = [lm.test_losses(r.runs(name)) for r in results]
        means = [np.mean(v) for v in losses]
        err = ([m - min(v) for m, v in zip(means, losses)], [max(v) - m for m, v in zip(means, losses)])
        for ax, xs in ((axes[0], [r.models[name].params for r in results]),
                       (axes[1], [flops(r, name) for r in results])):
            ax.errorbar(xs, means, yerr=err, fmt="o-", capsize=4, color=color, label=f"{name} (seed min-max)")
        for r, alpha in zip(results, np.linspace(0.35, 1, len(results))):
            curves = [run.curve for run in r.runs(name)]
            steps = len(min(curves, key=len))
            tokens = np.linspace(0, r.plan.tokens, steps)
            axes[2].plot(tokens / 1e6, np.mean([[v for _, v in c[:steps]] for c in curves], 0), color=color,
                         alpha=alpha, label=f"{name} {r.models[name].params / 1e3:.0f}K")
    for ax in axes[:2]:
        for n, ls in ((2, "--"), (3, ":")):
            ax.axhline(results[0].ngram[n][1], color="gray", ls=ls, lw=1, label=f"{'bi' if n == 2 else 'tri'}gram")
        ax.set_xscale("log")
        ax.minorticks_off()  # log-axis minor labels overlap over a decade
        ax.set(ylabel="test loss (nats/token, val 2nd half)")
        ax.legend(fontsize=7)
    params = [r.models["gpt"].params for r in results]  # ticks at the sizes: a range within a decade has no other
    axes[0].set_xticks(params, [f"{n / 1e3:.0f}K" for n in params])
    axes[0].set(xlabel="parameters (ticks: the GPT's)", title=f"loss against size\n({TOKENS_PER_PARAM} tokens per "
                f"parameter)")
    axes[1].set(xlabel="training FLOPs", title="loss against training compute")
    axes[2].set(xlabel="tokens seen (M)", ylabel="val loss (train.py's estimate, seed mean)",
                title="each pair against tokens seen\n(darker: larger)")
    axes[2].legend(fontsize=6, ncol=2)
    ctx.save(fig, "sizes.png", f"corpus {results[0].corpus}; GPT " + ", ".join(r.models["gpt"].desc for r in results)
             + " vs LSTM " + ", ".join(r.models["lstm"].desc for r in results) + f";\ncontext "
             f"{results[0].plan.block_size}, {results[0].plan.batch_size} sequences a step, {TOKENS_PER_PARAM} tokens "
             f"per parameter, fp32, each model's own Muon recipe at each size, seeds 0-2")
