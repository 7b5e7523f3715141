"""Reason (b), better use of long context: (i) sizes.py's largest pair scored at the last position of test windows
cut to their last k tokens, and by position; (ii) both models trained on text where a random span repeats D tokens
later, each at its own tuned recipe, scored on the repeat at each test D. `python -m scripts.report --only context`
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

from attnlab.checkpoint import load_model
from attnlab.config import compose
from data.corpus import load_split
from scripts.report import RUNS, lm, sizes
from scripts.report.protocol import Recipe, apart, best_recipe, mean_range
from scripts.report.tasks import train_config, train_loop

MATERIAL = 0.1  # nats: the smallest loss difference that counts on the repeat, where a copy moves nats
RULE = (f"text: on the largest data-rich pair (sizes), a model's effective context is the smallest k (1, 2, "
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


@dataclass(frozen=True)
class Budget:
    """What the context experiment may spend. Runs: 2 x 2 grid points per model on the repeat, in this process."""
    windows: int = 1024  # test windows (val 2nd half) cut to their last k tokens, scored at their last position
    distances: tuple = (16, 64, 128)  # the repeat's test D values (training draws D from training_distances)
    span: int = 8  # the repeated span's length, <= the smallest D, so the copies never overlap
    context: int = 144  # the repeat runs' window: room for the pair at many places even at the largest D
    batch_size: int = 8  # the repeat runs' sequences a step
    steps: int = 1000  # and steps, the same for both models
    adamw_lrs: tuple = (("gpt", (3e-3, 1e-2)), ("lstm", (1e-2, 3e-2)))  # each model's grids on the repeat
    muon_lrs: tuple = (("gpt", (0.02, 0.05)), ("lstm", (0.05, 0.15)))  # (best_recipe, seed SEED, widened once)
    sequences: int = 256  # selection and test sequences per D (from each val half)


QUICK = Budget()
BUDGET = dict(quick=QUICK, full=replace(QUICK, windows=2048, distances=(32, 128, 384), span=16, context=416,
                                        sequences=512))
SEED = 0  # the repeat runs' one seed: they are tuned and trained with it; their noise bars are the sequences' s.e.


@dataclass
class RepeatRun:
    """One model trained on the repeat corpus, and its selection loss (the repeat, val 1st half, mean over D)."""
    recipe: Recipe
    seed: int
    steps: int
    seconds: float
    select: float
    model: torch.nn.Module


def exp_context(ctx):
    """Loss against the tokens kept and by position (sizes' largest pair), and on the repeat against D."""
    shutil.rmtree(RUNS / "context", ignore_errors=True)
    budget, result = BUDGET[ctx.preset], (sizes.cached_sizes(ctx) or sizes.train_sizes(ctx))[-1]
    ks, rises = ks_for(result.plan.block_size), truncation_rises(ctx, budget, result)
    repeats = {name: repeat_test(ctx, budget, result, name) for name in lm.NAMES}
    evidence, status = context_rows(ctx, budget, result, ks, rises, repeats)
    ctx.verdict("context", "b", evidence, status, rule=RULE)
    context_figure(ctx, budget, result, ks, rises, repeats)


def ks_for(T):
    """k = 1, 2, 4, ... up to T/2, then T itself (the whole window: the reference)."""
    return [2 ** i for i in range(int(math.log2(T))) if 2 ** i <= T // 2] + [T]


@torch.no_grad()
def last_position_losses(model, tokens, T, ks, windows, batch_size=32):
    """{k: (windows,) losses at the last position of windows of T tokens with only their last k kept (cut, nothing
    put in its place)}; the same windows for every model."""
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
    """{name: (seeds, ks - 1, 2)}: per seed and k < T, the mean loss rise over the whole window from keeping the last
    k tokens only, and its standard error over the windows."""
    T, ks = result.plan.block_size, ks_for(result.plan.block_size)
    test_half = lm.halves(result.plan.data_dir)[1]
    rises = {}
    for name in lm.NAMES:
        per_run = []
        for run in tqdm(result.runs(name), desc=f"context: cutting {name}'s windows", leave=False):
            losses = last_position_losses(load_model(run.out, "latest", ctx.device)[0], test_half, T, ks,
                                          budget.windows)
            diffs = [losses[k] - losses[T] for k in ks[:-1]]
            per_run.append([(d.mean().item(), (d.std() / math.sqrt(len(d))).item()) for d in diffs])
        rises[name] = torch.tensor(per_run)
    return rises


def effective_context(ks, rise):
    """The smallest k from which on the rise stays within max(LOSS_MATERIAL, 2 s.e.); T where the rise at T/2 still
    exceeds it. rise: (mean, s.e.) per k of ks[:-1]."""
    effective = ks[-1]
    for k, (r, se) in reversed(list(zip(ks, rise))):
        if r > max(sizes.LOSS_MATERIAL, 2 * se):
            break
        effective = k
    return effective


def repeat_batch(tokens, batch_size, distances, span, T, alphabet, generator):
    """Windows of T + 1 tokens of text with one span drawn from alphabet written twice, D apart (D from distances per
    row), anywhere in the window. Returns inputs and targets (B, T), D (B,) and where the second copy starts (B,): the
    target index of its first copyable token (the span's first cannot be known)."""
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
    """About 64 distances log-spaced over the test D: too many to learn each by a fixed look-back, so a model must
    find the earlier copy by content."""
    return sorted(set(np.geomspace(min(distances), max(distances), 64).round().astype(int).tolist()))


def copy_targets(at, span):
    """The target indices (B, span - 1) of the copyable tokens of copies starting at `at` (B,)."""
    return at[:, None] + torch.arange(1, span, device=at.device) - 1


def repeat_model(result, name, T):
    """The lm experiment's model (its shape and corpus vocabulary) with a context of T."""
    return replace(compose(*result.models[name].overrides, f"model.block_size={T}").model, vocab_size=result.vocab)


def alphabet_of(result):
    """The span's tokens: the rarer half of the vocabulary, so that a token mostly finds its one earlier occurrence."""
    counts = np.bincount(load_split(result.plan.data_dir, "train"), minlength=result.vocab)
    return torch.from_numpy(counts.argsort()[:result.vocab // 2].copy())


def repeat_test(ctx, budget, result, name):
    """name tuned on the repeat by its own grids (seed SEED, the selection half), the chosen run scored once on the
    test half: dict(tuned, scores {D: dict(repeat, se, first)}, steps, seconds)."""
    def fit(recipe, seed):
        return repeat_fit(ctx, budget, result, name, recipe, seed)
    def flat(runs):  # no lr told apart: not worth widening a grid where nothing was learnt
        return max(r.select for r in runs) - min(r.select for r in runs) < MATERIAL
    tuned = best_recipe(fit, dict(budget.adamw_lrs)[name], dict(budget.muon_lrs)[name], [SEED],
                        lambda runs: -statistics.mean(r.select for r in runs), flat, widen=1)
    chosen, generator = tuned.runs[SEED], torch.Generator().manual_seed(SEED + 2)
    test_half, alphabet = lm.halves(result.plan.data_dir)[1], alphabet_of(result)
    scores = {D: repeat_scores(chosen.model, *repeat_batch(test_half, budget.sequences, [D], budget.span,
                                                           budget.context, alphabet, generator), budget.span)
              for D in budget.distances}
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
    return (f"span={budget.span} context={budget.context} {recipe.optimizer}"
            + (f" adamw_lr={recipe.lr:g}" if recipe.optimizer == "muon" else ""))


def repeat_fit(ctx, budget, result, name, recipe, seed):
    """One model trained on the repeat corpus with recipe (tasks.train_loop), scored on the selection half."""
    span, distances, T, steps = budget.span, budget.distances, budget.context, budget.steps
    train_tokens, select_half = load_split(result.plan.data_dir, "train"), lm.halves(result.plan.data_dir)[0]
    alphabet, train_ds, start = alphabet_of(result), training_distances(distances), time.time()

    def make_batch(it, generator):
        x, y, _, at = repeat_batch(train_tokens, budget.batch_size, train_ds, span, T, alphabet, generator)
        return x, copyable(y, at, span)  # a brief run spends every gradient on the copy (the text's: lm)

    # Muon's iterations in bf16 where the CPU computes it natively (train.py's default dtype)
    train_cfg = train_config(recipe, steps, steps // 10, dtype="auto")
    model, _ = train_loop(repeat_model(result, name, T), train_cfg, make_batch, ctx.device, seed, seed,
                          desc=f"context: repeat corpus, {name} {recipe}")
    seconds, generator = time.time() - start, torch.Generator().manual_seed(seed + 1)
    select = statistics.mean(
        repeat_scores(model, *repeat_batch(select_half, budget.sequences, [D], span, T, alphabet, generator),
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
    """The mean loss on the repeat's copyable tokens, its s.e. over the sequences, and on the first copy's."""
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
    """Whether the repeat costs less than both the first copy and a uniform guess over the alphabet by more than
    max(MATERIAL, 2 s.e.): beating a confidently wrong first copy alone is not copying."""
    return min(score["first"], uniform) - score["repeat"] > max(2 * score["se"], MATERIAL)


def text_outcome(gpt_effective, lstm_effective):
    """The text test by RULE, from each seed's effective context: "gpt", "lstm" (uses more) or None."""
    return {1: "gpt", -1: "lstm", 0: None}[apart(gpt_effective, lstm_effective)]


def repeat_outcome(gpt, lstm, gpt_copies, lstm_copies, distances):
    """The repeat test by RULE from each model's (loss, s.e.) by D and the D it copies at: "gpt", "lstm" or None."""
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
    T = result.plan.block_size
    effective = {n: [effective_context(ks, r) for r in rises[n].tolist()] for n in lm.NAMES}
    pair = f"{result.models['gpt'].desc} vs {result.models['lstm'].desc}, seeds {lm.seeds_range(result)}"
    ctx.row("context", "loss rise at the last position, only the last k tokens kept, k = "
            + " / ".join(map(str, ks[:-1])), *(" / ".join(f"{v:+.3f}" for v in rises[n][..., 0].mean(0).tolist())
                                               for n in lm.NAMES),
            f"{pair}, seed mean; {budget.windows} test windows; s.e. up to "
            + ", ".join(f"{n} {rises[n][..., 1].max().item():.3f}" for n in lm.NAMES))
    ctx.row("context", f"effective context per seed (the smallest k from which on the rise stays within "
            f"{sizes.LOSS_MATERIAL} nats and 2 s.e.), of {T}", *(", ".join(map(str, effective[n])) for n in lm.NAMES),
            f"{ks[0]} is the smallest k tried")
    curves = {n: torch.tensor([r.by_position for r in result.runs(n)]) for n in lm.NAMES}  # (seeds, T)
    ends = [e for e in (8, 64, 128, 256) if e < T] + [T]
    bins = list(zip([1, *[e + 1 for e in ends[:-1]]], ends))
    ctx.row("context", "test loss at positions " + " / ".join(f"{a}-{b}" for a, b in bins),
            *(" / ".join(mean_range(v) for v in lm.bin_means(curves[n], bins).T.tolist()) for n in lm.NAMES),
            f"{pair}; " + "; ".join(f"{n}: {lm.position_note(curves[n], bins)}" for n in lm.NAMES))
    distances, span = budget.distances, budget.span
    def losses(name, key):
        return " / ".join(f"{repeats[name]['scores'][D][key]:.3f}" for D in distances)
    trained = "; ".join(f"{n} {repeats[n]['tuned'].recipe} ({repeat_grids(repeats[n]['tuned'])}), "
                        f"{repeats[n]['steps']} steps in {repeats[n]['seconds']:.0f} s" for n in lm.NAMES)
    uniform = math.log(result.vocab // 2)
    ctx.row("context", f"loss on a repeated span of {span} random tokens at D = " + " / ".join(map(str, distances)),
            losses("gpt", "repeat"), losses("lstm", "repeat"),
            f"context {budget.context}, seed {SEED}; {trained}; first copy gpt {losses('gpt', 'first')}, lstm "
            f"{losses('lstm', 'first')}; uniform guess {uniform:.2f}; {budget.sequences} test sequences a D, s.e. up "
            f"to {max(s['se'] for r in repeats.values() for s in r['scores'].values()):.3f}")
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
    """The repeat's grids, each point with its selection loss."""
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
        distances, scores = budget.distances, repeats[name]["scores"]
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
    b.set_xticks(budget.distances, [str(D) for D in budget.distances])
    b.set(xlabel="distance D between the span and its repeat", ylabel="test loss on the span (nats/token)",
          title="repeat corpus, each model's own tuned recipe\n(bars: 2 s.e.)")
    for ax in (a, b):
        ax.legend(fontsize=7)
    trained = ", ".join(f"{n} {repeats[n]['tuned'].recipe}" for n in lm.NAMES)
    pair = f"{result.models['gpt'].desc} vs {result.models['lstm'].desc}"
    ctx.save(fig, "context.png", f"left and right: sizes' largest pair ({pair}), context {result.plan.block_size}, "
             f"{result.plan.tokens / 1e6:.1f}M tokens, seeds {lm.seeds_range(result)}\nmiddle: the same shapes at "
             f"context {budget.context}, {budget.steps} steps x {budget.batch_size} sequences on the repeat corpus "
             f"(D log-uniform in {min(budget.distances)}-{max(budget.distances)}), span {budget.span}, seed {SEED}: "
             f"{trained}")
