"""Reason (b), better use of long context and better loss as models and data grow: the lm experiment (rows that decide
nothing) and context use, with its rule (sizes.py holds the loss part's rule and runs; lm.py trains the models).

    lm        the GPT against the LSTM of the same size, each at its best recipe, at equal tokens and equal wall time,
              far below the data-rich regime: labelled with its tokens per parameter, it decides nothing; equal wall
              time is what a CPU user gets per second (reason (a)'s hardware question), not evidence for (b)
    context   how far back each model uses its context: (i) the largest data-rich pair of sizes.py, each seed scored
              at the last position of test windows cut to their last k tokens (clean text, nothing replaced), and
              its test loss by position; (ii) both models trained on text where a span of random tokens repeats at a
              distance drawn from a log-spaced range (the loss on the repeat only), each with its own tuned recipe,
              scored on the repeat at each test distance D, which only a model that reaches D tokens back can copy

    python -m scripts.report --only lm,context
"""
import math
import shutil
import statistics
import time
from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from attnlab.checkpoint import build_model
from attnlab.config import TrainConfig, compose
from attnlab.optim import get_lr, make_optimizer, set_lr, train_step
from data.corpus import load_split
from scripts.report import RUNS, lm, sizes
from scripts.report.protocol import Recipe, apart, best_recipe, mean_range

# The rules, written before the runs; ctx.verdict prints each beside its evidence.
MATERIAL = 0.1  # nats: the smallest loss difference that counts on the repeat, where a copy moves nats
CONTEXT_RULE = (f"text: on the largest data-rich pair (sizes), a model's effective context is the smallest k (1, 2, "
                f"4, ... T/2) from which on the loss at the last position with only the last k tokens kept stays "
                f"within max({sizes.LOSS_MATERIAL} nats, 2 standard errors over the windows) of the loss with the "
                f"whole window, per seed (3 seeds); the GPT uses more context where its seeds' effective contexts all "
                f"exceed the LSTM's (its loss keeps falling past where the LSTM's flattens). Repeat: a model copies "
                f"at D where its loss on the repeat is below both the first copy's and a uniform guess by more than "
                f"{MATERIAL} nats and 2 standard errors; a distance result counts only when both models copy at the "
                f"shortest D (else copying itself is what differs: reason (c)); then the GPT does better where the "
                f"LSTM's loss at the longest D is higher by more than {MATERIAL} nats and 2 standard errors and the "
                f"LSTM copies at fewer D or its loss rises more from the shortest D. Shown where the tests that decide "
                f"favour the GPT, contradicted where they favour the LSTM, otherwise not shown")

# windows: test windows (evenly spaced over the val split's 2nd half, overlapping where they must) cut to their last
# k tokens and scored at their last position; distances, span, context: the repeat corpus's test D values (training
# draws D from training_distances, spanning them), span length and window (room for the pair at many places even at
# the largest D); span <= the smallest D, so the copies never overlap; batch_size, steps: the repeat runs' sequences
# a step and steps, the same for both models; adamw_lrs, muon_lrs: each model's grids for the repeat (best_recipe,
# seed SEED, widened once past a winning end); sequences: selection and test sequences per D (from each val half).
# Runs: 2 x 2 grid points per model, trained in this process.
BUDGET = {
    "quick": dict(windows=1024, distances=[16, 64, 128], span=8, context=144, batch_size=8, steps=1000,
                  adamw_lrs=dict(gpt=[3e-3, 1e-2], lstm=[1e-2, 3e-2]),
                  muon_lrs=dict(gpt=[0.02, 0.05], lstm=[0.05, 0.15]), sequences=256),
    "full": dict(windows=2048, distances=[32, 128, 384], span=16, context=416, batch_size=8, steps=1000,
                 adamw_lrs=dict(gpt=[3e-3, 1e-2], lstm=[1e-2, 3e-2]),
                 muon_lrs=dict(gpt=[0.02, 0.05], lstm=[0.05, 0.15]), sequences=512),
}
SEED = 0  # the repeat runs' one seed: they are tuned and trained with it; their noise bars are the sequences' s.e.


# --- lm: equal tokens and equal wall time ---

def exp_lm(ctx):
    """The GPT against the LSTM of the same size, each at its best recipe, at equal tokens and equal time."""
    result = lm.train_lm(ctx)
    curves = {name: torch.tensor([r.by_position for r in result.runs(name)]) for name in lm.NAMES}
    lm_rows(ctx, result, curves)
    lm_figure(ctx, result, curves)


def lm_rows(ctx, result, curves):
    """The results table's lm rows; curves: each model's test loss by position at equal tokens, (seeds, T)."""
    gpt, lstm, plan = result.models["gpt"], result.models["lstm"], result.plan
    T, best, adamw = plan.block_size, {n: result.runs(n) for n in lm.NAMES}, {
        n: runs_by_seed(result.optimizer(n, "adamw")) for n in lm.NAMES}
    ctx.row("lm", "models", f"{gpt.desc}, {gpt.params:,} params", f"{lstm.desc}, {lstm.params:,} params",
            f"corpus {result.corpus} ({result.vocab} tokens; a unigram model, which ignores the context, scores "
            f"{result.unigram:.2f} nats on the train split); context {T} for both; {plan.batch_size} sequences a "
            f"step; fp32")
    per_param = plan.tokens / max(gpt.params, lstm.params)
    ctx.row("lm", f"test loss at equal tokens ({plan.tokens / 1e6:.2f}M, {per_param:.2g} tokens per parameter: "
            f"under-trained, decides nothing), each model's best recipe, final weights",
            *(mean_range(lm.test_losses(best[n])) for n in lm.NAMES),
            f"{plan.steps} steps each; {recipes_note(result)}; {lm.seeds_note(result)}; "
            f"{improving_note(best)}; {lm.ngram_note(result.ngram)}")
    stuck = {n: sum(r.test > result.unigram - MATERIAL for r in adamw[n]) for n in lm.NAMES}
    ctx.row("lm", f"test loss at equal tokens ({plan.tokens / 1e6:.2f}M), AdamW for both (an extra row, decides "
            f"nothing)", *(mean_range(lm.test_losses(adamw[n])) for n in lm.NAMES),
            "each model's AdamW grid's choice: " + "; ".join(grid_note(result.optimizer(n, "adamw"), n)
                                                             for n in lm.NAMES)
            + f"; seeds within {MATERIAL} nats of the unigram ({result.unigram:.2f}), runs that learnt nothing: "
            + ", ".join(f"{n} {stuck[n]} of {len(adamw[n])}" for n in lm.NAMES) + f"; {improving_note(adamw)}")
    ctx.row("lm", f"test loss at equal wall time ({result.budget_s:g} s of training on this CPU: what a user gets per "
            f"second, reason (a)'s hardware question, not evidence for (b)), each model's best recipe",
            *(mean_range(lm.test_losses(result.timed[n])) for n in lm.NAMES),
            f"train.time_budget_s={result.budget_s:g} for every run (the GPT's mean wall time at equal tokens), the "
            f"lr decaying over it; each model's recipe chosen at equal tokens, not tuned again at equal time: gpt "
            f"{result.tuned['gpt'].recipe}, lstm {result.tuned['lstm'].recipe}; {lm.seeds_note(result)}; "
            f"{improving_note(result.timed)}")
    ctx.row("lm", f"tokens seen in {result.budget_s:g} s (M)", *(
        mean_range([r.iters * plan.batch_size * T / 1e6 for r in result.timed[n]], 2) for n in lm.NAMES),
            f"{ctx.hardware}, one run at a time")
    ctx.row("lm", "wall seconds to the step cap at equal tokens (training and train.py's evaluations)",
            *(mean_range([r.seconds for r in best[n]], 0) for n in lm.NAMES), f"{ctx.hardware}, one run at a time")
    bins = lm.position_bins(T)
    def at(c):
        return " / ".join(mean_range(v, 3) for v in lm.bin_means(c, bins).T.tolist())  # c: (seeds, T)
    ctx.row("lm", "test loss at positions " + " / ".join(f"{a}-{b}" for a, b in bins), at(curves["gpt"]),
            at(curves["lstm"]), f"equal tokens, best recipes; {lm.seeds_note(result)}; the test half in windows of "
            f"{T}, the same for both models; " + "; ".join(f"{name}: {lm.position_note(curves[name], bins)}"
                                                          for name in curves))
    ctx.row("lm", f"loss change from positions 65-128 to 129-{T}" if T >= 256 else "loss change past position 128",
            *(f"{lm.change(curves[name], (65, 128), (129, T))[0]:+.3f}" if T >= 256 else "-" for name in curves),
            lm.kaplan_note(curves, T))


def runs_by_seed(tuned):
    return [tuned.runs[seed] for seed in sorted(tuned.runs)]


def grid_note(tuned, name):
    """The chosen grid point among those tried (the grid may have been widened), and its mean selection loss."""
    key = "muon_lr" if tuned.recipe.optimizer == "muon" else "lr"
    tried = ", ".join(f"{recipe.grid_lr:g}" for recipe, _ in tuned.tried)
    part = f" (AdamW part at lr {tuned.recipe.lr:g})" if tuned.recipe.optimizer == "muon" else ""
    return (f"{name} {tuned.recipe.optimizer} {key} {tuned.recipe.grid_lr:g} of [{tried}]{part}"
            + (" (an end of the grid: the best may lie beyond)" if tuned.edge else "")
            + f", mean selection loss {-lm.selection_merit(list(tuned.runs.values())):.3f}")


def recipes_note(result):
    """Each model's two grids and the recipe chosen between them."""
    return "; ".join(f"{grid_note(result.optimizer(n, 'adamw'), n)}; {grid_note(result.optimizer(n, 'muon'), n)}; "
                     f"{n} chose {result.tuned[n].recipe}" for n in lm.NAMES)


def improving_note(runs):
    """How many of each model's runs {name: [LMRun]} were still improving at their end."""
    return (f"still improving at the end (> {lm.PLATEAU_NATS} nats over the last quarter): " + ", ".join(
        f"{n} {sum(r.improving for r in rs)} of {len(rs)} seeds" for n, rs in runs.items()))


def lm_figure(ctx, result, curves):
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 3.8))
    T = result.plan.block_size
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        for optimizer, style in (("adamw", "o-"), ("muon", "s--")):
            tuned = result.optimizer(name, optimizer)
            a.semilogx([r.grid_lr for r, _ in tuned.tried], [-m for _, m in tuned.tried], style, color=color,
                       label=f"{name} {optimizer} ({'lr' if optimizer == 'adamw' else 'muon_lr'})")
            chosen = dict((r.grid_lr, -m) for r, m in tuned.tried)[tuned.recipe.grid_lr]
            a.plot(tuned.recipe.grid_lr, chosen, "*", ms=12 if tuned is result.tuned[name] else 7, color=color)
        for runs, style, when in ((result.runs(name), "-", "equal tokens"), (result.timed[name], "--", "equal time")):
            for r in runs:
                b.plot(*zip(*r.curve), style, lw=1, color=color, label=f"{name}, {when}" if not r.seed else None)
        starts, bins = lm.half_octaves(curves[name])  # (seeds, bins)
        centers = [(s + e - 1) / 2 for s, e in zip(starts, [*starts[1:], T + 1])]
        c.semilogx(range(1, T + 1), curves[name].mean(0), color=color, alpha=0.25, lw=0.6)
        c.errorbar(centers, bins.mean(0), yerr=(bins.mean(0) - bins.min(0).values, bins.max(0).values - bins.mean(0)),
                   fmt="o-", ms=3, color=color, label=f"{name}: half-octave bins, seed min-max")
    b.axvline(result.budget_s, color="gray", ls=":", lw=1)
    c.axhline(result.unigram, color="gray", ls="--", lw=1, label="unigram (no context, train split)")
    for (n, (k, loss)), ls in zip(result.ngram.items(), ("-.", ":")):
        c.axhline(loss, color="black", ls=ls, lw=1, label=f"{'bigram' if int(n) == 2 else 'trigram'} (add-{k:g})")
    a.set(xlabel="peak learning rate of the grid (lr or muon_lr)", ylabel="selection loss (val 1st half)",
          title="grids at equal tokens (big ★: the best recipe)")
    b.set(xlabel="wall seconds (training + train.py's evals)", ylabel="val loss (train.py's estimate)",
          title=f"best recipes, seeds {lm.seeds_range(result)} (dotted: the time budget)")
    c.set(xlabel="position in the context", ylabel="test loss (nats/token)", title="loss by position, equal tokens")
    for ax in (a, b, c):
        ax.legend(fontsize=7)
    ctx.save(fig, "lm.png", lm.lm_detail(result))


# --- context: truncation on text, and the repeat corpus ---

@dataclass
class RepeatRun:
    """One model trained on the repeat corpus with one recipe, and its selection loss (the repeat's copyable tokens,
    the val split's 1st half, mean over the distances)."""
    recipe: Recipe
    seed: int
    steps: int
    seconds: float
    select: float
    model: torch.nn.Module


def exp_context(ctx):
    """The largest data-rich pair's loss against the tokens kept and by position, and the repeat corpus's loss
    against D."""
    shutil.rmtree(RUNS / "context", ignore_errors=True)
    budget, result = BUDGET[ctx.preset], (sizes.cached_sizes(ctx) or sizes.train_sizes(ctx))[-1]
    ks, rises = ks_for(result.plan.block_size), truncation_rises(ctx, budget, result)
    repeats = {name: repeat_test(ctx, budget, result, name) for name in lm.NAMES}
    evidence, status = context_rows(ctx, budget, result, ks, rises, repeats)
    ctx.verdict("context", "b", evidence, status, rule=CONTEXT_RULE)
    context_figure(ctx, budget, result, ks, rises, repeats)


def ks_for(T):
    """k = 1, 2, 4, ... up to T/2, then T itself (the whole window: the reference)."""
    return [2 ** i for i in range(int(math.log2(T))) if 2 ** i <= T // 2] + [T]


@torch.no_grad()
def last_position_losses(model, tokens, T, ks, windows, batch_size=32):
    """The loss at the last position of windows of T tokens of tokens with only the last k tokens kept (the window
    cut, nothing put in its place), {k: (windows,) losses}; the same windows for every model."""
    starts = np.linspace(0, len(tokens) - T - 1, windows).astype(int)
    device, losses = next(model.parameters()).device, {k: [] for k in ks}
    for i in range(0, len(starts), batch_size):
        rows = torch.from_numpy(tokens[starts[i:i + batch_size, None] + np.arange(T + 1)].astype(np.int64))
        x, y = rows[:, :-1].to(device), rows[:, -1].to(device)  # (B, T), (B,)
        for k in ks:
            logits = model(x[:, T - k:], last_logits_only=True)[0][:, -1]  # (B, V)
            losses[k].append(F.cross_entropy(logits.float(), y, reduction="none").cpu())
    return {k: torch.cat(v) for k, v in losses.items()}


def truncation_rises(ctx, budget, result):
    """{name: (seeds, ks - 1, 2)}: for every seed of the pair's equal-token runs and every k < T, the mean loss rise
    over the whole window from keeping the last k tokens only, and its standard error over the windows."""
    T, ks = result.plan.block_size, ks_for(result.plan.block_size)
    test_half = lm.halves(result.plan.data_dir)[1]
    rises = {}
    for name in lm.NAMES:
        per_run = []
        for run in tqdm(result.runs(name), desc=f"context: cutting {name}'s windows", leave=False):
            losses = last_position_losses(lm.final_model(run.out, device=ctx.device), test_half, T, ks,
                                          budget["windows"])
            diffs = [losses[k] - losses[T] for k in ks[:-1]]
            per_run.append([(d.mean().item(), (d.std() / math.sqrt(len(d))).item()) for d in diffs])
        rises[name] = torch.tensor(per_run)
    return rises


def effective_context(ks, rise):
    """The smallest k from which on (every k' >= k) the rise stays within max(LOSS_MATERIAL, 2 standard errors);
    T (ks[-1]) where the rise at T/2 still exceeds it. rise: (mean, s.e.) per k of ks[:-1]."""
    effective = ks[-1]
    for k, (r, se) in reversed(list(zip(ks, rise))):
        if r > max(sizes.LOSS_MATERIAL, 2 * se):
            break
        effective = k
    return effective


def repeat_batch(tokens, batch_size, distances, span, T, alphabet, generator):
    """Windows of T + 1 tokens of text (tokens) in which one span of tokens drawn uniformly from alphabet (ids)
    appears twice, the second copy D after the first, both anywhere in the window (no fixed place to find them by); D
    drawn from distances per row. Returns inputs and targets (B, T), D (B,) and where the second copy starts (B,),
    which is also the target index of its first copyable token (its first token cannot be known, the other span - 1
    can be copied)."""
    starts = torch.randint(len(tokens) - T - 1, (batch_size,), generator=generator)
    s = torch.from_numpy(tokens[starts.numpy()[:, None] + np.arange(T + 1)].astype(np.int64))  # (B, T + 1)
    d = torch.tensor(distances)[torch.randint(len(distances), (batch_size,), generator=generator)]  # (B,)
    at = d + (torch.rand(batch_size, generator=generator) * (T + 2 - span - d)).long()  # in [D, T + 1 - span]
    spans = alphabet[torch.randint(len(alphabet), (batch_size, span), generator=generator)]  # (B, span)
    rows, offsets = torch.arange(batch_size)[:, None], torch.arange(span)
    s[rows, (at - d)[:, None] + offsets] = spans
    s[rows, at[:, None] + offsets] = spans
    return s[:, :-1], s[:, 1:], d, at


def training_distances(distances):
    """About 64 distances log-spaced from the smallest test D to the largest: trained on these, a model cannot copy
    each test D by a head that looks back that many positions, only by finding the span's earlier copy by content."""
    return sorted(set(np.geomspace(min(distances), max(distances), 64).round().astype(int).tolist()))


def copy_targets(at, span):
    """The target indices (B, span - 1) of the copyable tokens of copies starting at at (B,)."""
    return at[:, None] + torch.arange(1, span, device=at.device) - 1


def repeat_model(result, name, T):
    """The lm experiment's model (its shape and corpus vocabulary) with a context of T."""
    return replace(compose(*result.models[name].overrides, f"model.block_size={T}").model, vocab_size=result.vocab)


def alphabet_of(result):
    """The span's tokens: the rarer half of the vocabulary, so that the current token mostly finds its one earlier
    occurrence in the span (common characters would match all over the text between the copies)."""
    counts = np.bincount(load_split(result.plan.data_dir, "train"), minlength=result.vocab)
    return torch.from_numpy(counts.argsort()[:result.vocab // 2].copy())


def repeat_test(ctx, budget, result, name):
    """name tuned on the repeat corpus by its own grids (best_recipe, seed SEED, on the selection half), then the
    chosen run scored once on the test half: dict(tuned, scores {D: dict(repeat, se, first)})."""
    def fit(recipe, seed):
        return repeat_fit(ctx, budget, result, name, recipe, seed)
    def flat(runs):  # no lr told apart: not worth widening a grid where nothing was learnt
        return max(r.select for r in runs) - min(r.select for r in runs) < MATERIAL
    tuned = best_recipe(fit, budget["adamw_lrs"][name], budget["muon_lrs"][name], [SEED], 1,
                        lambda runs: -statistics.mean(r.select for r in runs), flat, widen=1)
    chosen, generator = tuned.runs[SEED], torch.Generator().manual_seed(SEED + 2)
    test_half, alphabet = lm.halves(result.plan.data_dir)[1], alphabet_of(result)
    scores = {D: repeat_scores(chosen.model, *repeat_batch(test_half, budget["sequences"], [D], budget["span"],
                                                           budget["context"], alphabet, generator), budget["span"])
              for D in budget["distances"]}
    for D, score in scores.items():
        for metric in ("repeat", "first"):
            ctx.grid_point("context", name, f"repeat D={D} {repeat_setting(budget, chosen.recipe)}",
                           chosen.recipe.grid_lr, SEED, chosen.steps, chosen.seconds,
                           f"{'repeated' if metric == 'repeat' else 'first'} span test loss", round(score[metric], 4))
    for t in [tuned, *tuned.others]:
        for r in t.runs.values():
            r.model = None  # the chosen run is scored; the rest of the models can go
    return dict(tuned=tuned, scores=scores, steps=chosen.steps, seconds=chosen.seconds)


def repeat_setting(budget, recipe):
    return (f"span={budget['span']} context={budget['context']} {recipe.optimizer}"
            + (f" adamw_lr={recipe.lr:g}" if recipe.optimizer == "muon" else ""))


def repeat_fit(ctx, budget, result, name, recipe, seed):
    """One model trained on the repeat corpus with recipe (warmup then cosine to lr/10, as the lm runs), scored on
    the selection half: a RepeatRun."""
    span, distances, T, steps = budget["span"], budget["distances"], budget["context"], budget["steps"]
    train_tokens, select_half = load_split(result.plan.data_dir, "train"), lm.halves(result.plan.data_dir)[0]
    alphabet = alphabet_of(result)
    torch.manual_seed(seed)
    model = build_model(repeat_model(result, name, T)).to(ctx.device)
    train_cfg = TrainConfig(learning_rate=recipe.lr, min_lr=recipe.lr / 10, max_iters=steps, warmup_iters=steps // 10,
                            optimizer=recipe.optimizer,
                            **(dict(muon_lr=recipe.muon_lr) if recipe.optimizer == "muon" else {}))
    optimizer = make_optimizer(model, train_cfg, ctx.device)
    generator, start, train_ds = torch.Generator().manual_seed(seed), time.time(), training_distances(distances)
    for it in tqdm(range(steps), desc=f"context: repeat corpus, {name} {recipe}", leave=False):
        set_lr(optimizer, get_lr(it, train_cfg))
        x, y, _, at = repeat_batch(train_tokens, budget["batch_size"], train_ds, span, T, alphabet, generator)
        y = copyable(y, at, span)  # a brief run spends every gradient on the copy (the text's loss: the lm experiment)
        train_step(model, optimizer, [(x.to(ctx.device), y.to(ctx.device))], grad_clip=train_cfg.grad_clip)
    seconds, generator = time.time() - start, torch.Generator().manual_seed(seed + 1)
    model.eval()
    select = statistics.mean(
        repeat_scores(model, *repeat_batch(select_half, budget["sequences"], [D], span, T, alphabet, generator),
                      span)["repeat"] for D in distances)
    ctx.grid_point("context", name, repeat_setting(budget, recipe), recipe.grid_lr, seed, steps, seconds,
                   "repeated span selection loss, mean over D", round(select, 4))
    return RepeatRun(recipe, seed, steps, seconds, select, model)


def copyable(y, at, span):
    """Targets y (B, T) with only the repeat's copyable span - 1 kept, -1 (ignored) elsewhere."""
    keep = copy_targets(at, span)
    return torch.full_like(y, -1).scatter(1, keep, y.gather(1, keep))


@torch.no_grad()
def repeat_scores(model, x, y, d, at, span, batch_size=32):
    """Mean loss over the repeat's copyable tokens, its standard error over the sequences, and the mean loss at the
    same tokens of the first copy."""
    device, repeat, first = next(model.parameters()).device, [], []
    for i in range(0, len(x), batch_size):
        xb, yb = x[i:i + batch_size].to(device), y[i:i + batch_size].to(device)
        db, ab = d[i:i + batch_size].to(device), at[i:i + batch_size].to(device)
        losses = F.cross_entropy(model(xb)[0].transpose(1, 2), yb, reduction="none")  # (B, T)
        repeat.append(losses.gather(1, copy_targets(ab, span)).mean(1))
        first.append(losses.gather(1, copy_targets(ab - db, span)).mean(1))
    repeat, first = torch.cat(repeat), torch.cat(first)
    return dict(repeat=repeat.mean().item(), se=(repeat.std() / math.sqrt(len(repeat))).item(),
                first=first.mean().item())


def copied(score, uniform):
    """Whether the repeat costs less than both the first copy and a uniform guess over the span's alphabet (uniform,
    nats) by more than MATERIAL and twice the repeat's standard error: a model that is confidently wrong on the first
    copy has not copied by beating it alone."""
    return min(score["first"], uniform) - score["repeat"] > max(2 * score["se"], MATERIAL)


def text_outcome(gpt_effective, lstm_effective):
    """The text test by CONTEXT_RULE, from each seed's effective context: "gpt", "lstm" (uses more) or None."""
    return {1: "gpt", -1: "lstm", 0: None}[apart(gpt_effective, lstm_effective)]


def repeat_outcome(gpt, lstm, gpt_copies, lstm_copies, distances):
    """The repeat test by CONTEXT_RULE: gpt, lstm: the repeat's (loss, standard error) by D (ascending); *_copies: the
    distances each model copies at. "gpt", "lstm" or None (undecided, or a distance result that does not count)."""
    if distances[0] not in gpt_copies or distances[0] not in lstm_copies:
        return None
    gap = lstm[-1][0] - gpt[-1][0]
    gap_noise = max(2 * math.hypot(gpt[-1][1], lstm[-1][1]), MATERIAL)
    rise = (lstm[-1][0] - lstm[0][0]) - (gpt[-1][0] - gpt[0][0])
    rise_noise = max(2 * math.sqrt(sum(se ** 2 for _, se in (gpt[0], gpt[-1], lstm[0], lstm[-1]))), MATERIAL)
    if gap < -gap_noise:
        return "lstm"
    if gap > gap_noise and (len(lstm_copies) < len(gpt_copies) or rise > rise_noise):
        return "gpt"
    return None


def context_status(text, repeat, lstm_copies_shortest):
    """The verdict from the two tests' outcomes (text_outcome, repeat_outcome)."""
    outcomes = {text, repeat} - {None}
    if outcomes == {"gpt"}:
        return "shown here"
    if outcomes == {"lstm"}:
        return "contradicted here"
    if not lstm_copies_shortest:
        return "not shown here (the LSTM does not copy even at the shortest D: that is reason (c))"
    return "not shown here"


def context_rows(ctx, budget, result, ks, rises, repeats):
    """The context rows; returns the verdict's (evidence, status)."""
    T, recipes = result.plan.block_size, {n: result.tuned[n].recipe for n in lm.NAMES}
    effective = {n: [effective_context(ks, r) for r in rises[n].tolist()] for n in lm.NAMES}
    models = (f"the largest data-rich pair (sizes: {result.models['gpt'].desc} vs {result.models['lstm'].desc}, "
              f"{result.plan.tokens / 1e6:.1f}M tokens; gpt {recipes['gpt']}, lstm {recipes['lstm']}), context {T}, "
              f"seeds {lm.seeds_range(result)}")
    ctx.row("context", "loss rise at the last position, only the last k tokens kept, k = "
            + " / ".join(map(str, ks[:-1])), *(" / ".join(f"{v:+.3f}" for v in rises[n][..., 0].mean(0).tolist())
                                               for n in lm.NAMES),
            f"{models}; mean of the seeds; the window cut to its last k tokens (clean text, nothing replaced); "
            f"{budget['windows']} test windows (val 2nd half) scored at the last position; standard error over the "
            f"windows up to " + ", ".join(f"{n} {rises[n][..., 1].max().item():.3f}" for n in lm.NAMES))
    ctx.row("context", f"effective context per seed (the smallest k from which on the rise stays within "
            f"{sizes.LOSS_MATERIAL} nats and 2 s.e.), of {T}", *(", ".join(map(str, effective[n])) for n in lm.NAMES),
            f"{ks[0]} is the smallest k tried, a floor of what this measure tells")
    curves = {n: torch.tensor([r.by_position for r in result.runs(n)]) for n in lm.NAMES}  # (seeds, T)
    ends = [e for e in (8, 64, 128, 256) if e < T] + [T]
    bins = list(zip([1, *[e + 1 for e in ends[:-1]]], ends))
    ctx.row("context", "test loss at positions " + " / ".join(f"{a}-{b}" for a, b in bins),
            *(" / ".join(mean_range(v) for v in lm.bin_means(curves[n], bins).T.tolist()) for n in lm.NAMES),
            f"{models}; every window of the test half; " + "; ".join(f"{n}: {lm.position_note(curves[n], bins)}"
                                                                    for n in lm.NAMES))
    distances, span = budget["distances"], budget["span"]
    def losses(name, key):
        return " / ".join(f"{repeats[name]['scores'][D][key]:.3f}" for D in distances)
    trained = "; ".join(f"{n} {repeats[n]['tuned'].recipe} ({repeat_grids(repeats[n]['tuned'])}), "
                        f"{repeats[n]['steps']} steps in {repeats[n]['seconds']:.0f} s" for n in lm.NAMES)
    uniform = math.log(result.vocab // 2)
    ctx.row("context", f"loss on a repeated span of {span} random tokens at D = " + " / ".join(map(str, distances)),
            losses("gpt", "repeat"), losses("lstm", "repeat"),
            f"each model trained on text (the lm corpus) with a span repeated at a distance drawn log-uniform from "
            f"{min(distances)}-{max(distances)}, its loss on the repeat's copyable {span - 1} tokens only, context "
            f"{budget['context']}, {budget['batch_size']} sequences a step, seed {SEED}; each model's recipe tuned "
            f"on the repeat itself (AdamW's lr grid, then Muon's muon_lr grid, chosen on the val split's 1st half): "
            f"{trained}; the first copy costs gpt {losses('gpt', 'first')}, lstm {losses('lstm', 'first')} (a uniform "
            f"guess over the span's alphabet, the vocabulary's rarer half: {uniform:.2f}); {budget['sequences']} test "
            f"sequences a D (val 2nd half), standard error up to "
            f"{max(s['se'] for r in repeats.values() for s in r['scores'].values()):.3f}")
    by_d = {n: [(repeats[n]["scores"][D]["repeat"], repeats[n]["scores"][D]["se"]) for D in distances]
            for n in lm.NAMES}
    copies = {n: [D for D in distances if copied(repeats[n]["scores"][D], uniform)] for n in lm.NAMES}
    text = text_outcome(effective["gpt"], effective["lstm"])
    repeat = repeat_outcome(by_d["gpt"], by_d["lstm"], copies["gpt"], copies["lstm"], distances)
    status = context_status(text, repeat, distances[0] in copies["lstm"])
    lo, hi = distances[0], distances[-1]
    counts = distances[0] in copies["gpt"] and distances[0] in copies["lstm"]
    evidence = (f"text (clean, the largest data-rich pair): effective context per seed gpt "
                f"{', '.join(map(str, effective['gpt']))}, lstm {', '.join(map(str, effective['lstm']))} of {T} "
                f"(k from {ks[0]}), "
                + (f"{text} uses more" if text else "not apart") + "; repeat: copies at D = "
                + "; ".join(f"{n} {', '.join(map(str, copies[n])) or 'none'}" for n in lm.NAMES)
                + f"; loss on the repeat from D = {lo} to {hi}: gpt {by_d['gpt'][0][0]:.3f} -> {by_d['gpt'][-1][0]:.3f}"
                f", lstm {by_d['lstm'][0][0]:.3f} -> {by_d['lstm'][-1][0]:.3f}, "
                + ((f"{repeat} does better far off" if repeat else "no difference that counts") if counts else
                   f"a distance result does not count, as not both models copy at D = {lo} (copying at all is "
                   f"reason (c))"))
    gap = by_d["lstm"][-1][0] - by_d["gpt"][-1][0]
    ctx.row("context", f"gap at D = {hi}, LSTM - GPT, repeated span", f"{gap:+.3f}", "-",
            f"{evidence}; that the LSTM uses long context worse than attention is {status}")
    return evidence, status


def repeat_grids(tuned):
    """The repeat's grids tried, with their selection losses."""
    return "; ".join(f"{t.recipe.optimizer} " + ", ".join(f"{r.grid_lr:g}: {-m:.3f}" for r, m in t.tried)
                     for t in sorted([tuned, *tuned.others], key=lambda t: t.recipe.optimizer))


def context_figure(ctx, budget, result, ks, rises, repeats):
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4))
    T = result.plan.block_size
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        r = rises[name][..., 0]  # (seeds, ks - 1)
        mean = r.mean(0)
        a.errorbar(ks[:-1], mean, yerr=(mean - r.min(0).values, r.max(0).values - mean), fmt="o-", ms=3, capsize=3,
                   color=color, label=f"{name} ({len(r)} seeds, min-max)")
        for k in sorted(set(effective_context(ks, seed) for seed in rises[name].tolist())):
            a.axvline(k, color=color, ls=":", lw=1)
        distances, scores = budget["distances"], repeats[name]["scores"]
        b.errorbar(distances, [scores[D]["repeat"] for D in distances], yerr=[2 * scores[D]["se"] for D in distances],
                   fmt="o-", capsize=3, color=color, label=f"{name}: repeated span")
        b.plot(distances, [scores[D]["first"] for D in distances], "--", color=color, lw=1,
               label=f"{name}: first copy")
        curves = torch.tensor([run.by_position for run in result.runs(name)])
        starts, binned = lm.half_octaves(curves)  # (seeds, bins)
        centers = [(s + e - 1) / 2 for s, e in zip(starts, [*starts[1:], T + 1])]
        c.errorbar(centers, binned.mean(0), yerr=(binned.mean(0) - binned.min(0).values,
                                                  binned.max(0).values - binned.mean(0)),
                   fmt="o-", ms=3, color=color, label=f"{name}: half-octave bins, seed min-max")
    c.set_xscale("log")
    c.set(xlabel="position in the context", ylabel="test loss (nats/token)",
          title="the same pair: loss by position\n(every test window)")
    c.legend(fontsize=7)
    a.set_xscale("log", base=2)
    a.set_xticks(ks[:-1], [str(k) for k in ks[:-1]])
    a.axhline(0, color="gray", lw=0.8)
    a.axhline(sizes.LOSS_MATERIAL, color="gray", ls="--", lw=0.8, label=f"{sizes.LOSS_MATERIAL} nats")
    a.set(xlabel="k (tokens kept before the scored one)", ylabel="loss rise over the whole window (nats)",
          title="the largest data-rich pair: window cut to its last k\n(dotted: each seed's effective context)")
    b.axhline(math.log(result.vocab // 2), color="gray", ls=":", lw=1, label="a uniform guess over the alphabet")
    b.set_xscale("log", base=2)
    b.set_xticks(budget["distances"], [str(D) for D in budget["distances"]])
    b.set(xlabel="distance D between the span and its repeat", ylabel="test loss on the span (nats/token)",
          title="repeat corpus, each model's own tuned recipe\n(bars: 2 s.e.)")
    for ax in (a, b):
        ax.legend(fontsize=7)
    trained = ", ".join(f"{n} {repeats[n]['tuned'].recipe}" for n in lm.NAMES)
    pair = f"{result.models['gpt'].desc} vs {result.models['lstm'].desc}"
    ctx.save(fig, "context.png", f"left and right: sizes' largest pair ({pair}), context {result.plan.block_size}, "
             f"{result.plan.tokens / 1e6:.1f}M tokens, seeds {lm.seeds_range(result)}\nmiddle: the same shapes at "
             f"context "
             f"{budget['context']}, trained {budget['steps']} steps x {budget['batch_size']} sequences on the repeat "
             f"corpus (D log-uniform in {min(budget['distances'])}-{max(budget['distances'])}), span {budget['span']}, "
             f"seed {SEED}: {trained}")
