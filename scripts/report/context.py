"""How far back each model uses its context, two ways: (i) the lm experiment's trained models scored at the last
position of a window whose tokens more than k back are replaced by draws from the corpus's unigram distribution
(Khandelwal et al. 2018: the k past which replacing changes nothing is the context a model uses); (ii) both models
trained briefly on text where a span of random tokens repeats at a distance drawn from a log-spaced range (the loss
on the repeat only), scored on the repeat at each test distance D, which only a model that reaches D tokens back can
copy.
    python -m scripts.report --only context
"""
import math
import shutil
import time
from dataclasses import replace

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from attnlab.checkpoint import build_model
from attnlab.config import TrainConfig, compose
from attnlab.optim import get_lr, make_optimizer, set_lr, train_step
from data.corpus import load_split
from scripts.report import RUNS, lm

# windows: test windows (evenly spaced over the val split's 2nd half, overlapping where they must) scored at their
# last position for every k; distances, span, context: the repeat corpus's test D values (training draws D from
# training_distances, spanning them), span length and window (room for the pair at many places even at the largest
# D); span <= the smallest D, so the copies never overlap; batch_size, steps: the repeat runs' sequences a step and
# steps, the same for both models (at context 1024 and 4 sequences a step the full GPT had not learned to copy in
# 2,000 steps: docs/log.md); test_sequences: test sequences per D (their text from the val split's 2nd half).
# Sized by steps x one measured step; the presets' wall times, with their machine, are in docs/report.md.
BUDGET = {
    "quick": dict(windows=512, distances=[32, 128, 256], span=16, context=336, batch_size=8, steps=2000,
                  test_sequences=256),
    "full": dict(windows=768, distances=[32, 128, 512], span=32, context=640, batch_size=8, steps=2000,
                 test_sequences=512),
}
SEED = 0  # the repeat runs' one training seed: their noise bars are the test sequences' standard error


def exp_context(ctx):
    """The loss rise against k on the lm experiment's models, and the repeat corpus's loss against D."""
    shutil.rmtree(RUNS / "context", ignore_errors=True)
    budget, summary = BUDGET[ctx.preset], lm.lm_results(ctx)
    rises = truncation_rises(ctx, budget, summary)
    repeats = {name: repeat_run(ctx, budget, summary, name) for name in ("gpt", "lstm")}
    context_rows(ctx, budget, summary, rises, repeats)
    context_figure(ctx, budget, summary, rises, repeats)


def truncate(x, k, unigram, generator):
    """x (B, T) with every token more than k back from the last replaced by a draw from unigram (V,): the last k
    kept."""
    out = x.clone()
    far = x.size(1) - k
    if far > 0:
        draws = torch.multinomial(unigram, x.size(0) * far, replacement=True, generator=generator)
        out[:, :far] = draws.view(x.size(0), far)
    return out


def ks_for(T):
    """k = 8, 16, 32, ... below T, then T itself (nothing replaced)."""
    return [8 * 2 ** i for i in range(int(math.log2(T / 8)) + 1) if 8 * 2 ** i < T] + [T]


@torch.no_grad()
def last_position_losses(model, tokens, T, ks, unigram, windows, batch_size=32):
    """The mean loss at the last position of windows of T tokens of tokens, {k: loss} with every token more than k
    back replaced; the same windows and the same replacement draws for every model."""
    starts = np.linspace(0, len(tokens) - T - 1, windows).astype(int)
    device, total = next(model.parameters()).device, {k: 0.0 for k in ks}
    generator = torch.Generator().manual_seed(0)
    for i in range(0, len(starts), batch_size):
        rows = torch.from_numpy(tokens[starts[i:i + batch_size, None] + np.arange(T + 1)].astype(np.int64))
        x, y = rows[:, :-1], rows[:, -1]  # (B, T), (B,)
        for k in ks:
            logits = model(truncate(x, k, unigram, generator).to(device), last_logits_only=True)[0][:, -1]  # (B, V)
            total[k] += F.cross_entropy(logits, y.to(device), reduction="sum").item()
    return {k: v / len(starts) for k, v in total.items()}


def truncation_rises(ctx, budget, summary):
    """{name: (runs, ks) tensor of the loss rise over the full window} for every seed of the lm experiment."""
    T, data_dir = summary["block_size"], summary["data_dir"]
    counts = np.bincount(load_split(data_dir, "train"), minlength=summary["vocab"])
    unigram = torch.from_numpy(counts / counts.sum()).float()
    test_half, ks = lm.halves(data_dir)[1], ks_for(T)
    rises = {}
    for name in ("gpt", "lstm"):
        per_run = []
        for run in tqdm(summary[name]["runs"], desc=f"context: truncating {name}", leave=False):
            losses = last_position_losses(lm.final_model(run["out"], device=ctx.device), test_half, T, ks, unigram,
                                          budget["windows"])
            per_run.append([losses[k] - losses[T] for k in ks])
        rises[name] = torch.tensor(per_run)
    return rises


def effective_context(ks, rises):
    """The smallest k from which on (every k' >= k) the seeds' mean loss rise is no larger than their min-max range
    there: context further back than k changes the loss by no more than the seeds differ. rises: (seeds, ks)."""
    mean, spread = rises.mean(0), rises.max(0).values - rises.min(0).values
    effective = ks[-1]
    for k, m, s in reversed(list(zip(ks, mean.tolist(), spread.tolist()))):
        if m > s:
            break
        effective = k
    return effective


def repeat_batch(tokens, batch_size, distances, span, T, alphabet, generator):
    """Windows of T + 1 tokens of text (tokens) in which one span of tokens drawn uniformly from alphabet (ids)
    appears twice, the second
    copy D after the first, both anywhere in the window (no fixed place to find them by); D drawn from distances per
    row. Returns inputs and targets (B, T), D (B,) and where the second copy starts (B,), which is also the target
    index of its first copyable token (its first token cannot be known, the other span - 1 can be copied)."""
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


def repeat_model(summary, name, T):
    """The lm experiment's model (its shape and corpus vocabulary) with a context of T."""
    return replace(compose(*summary[name]["overrides"], f"model.block_size={T}").model, vocab_size=summary["vocab"])


def repeat_run(ctx, budget, summary, name):
    """One model trained on the repeat corpus with its best recipe on the lm corpus, then its loss on the repeat and
    on the first copy (the same offsets, not copyable) at each D: {D: dict(repeat, se, first)}, with the run's
    recipe, steps and seconds."""
    span, distances, data_dir = budget["span"], budget["distances"], summary["data_dir"]
    T, vocab, lr, steps = budget["context"], summary["vocab"], summary[name]["lr"], budget["steps"]
    # each model's best recipe on this text, the lm experiment's equal-time choice (with AdamW alone, the lm
    # experiment's equal-token recipe, the GPT barely copies in these steps: docs/log.md)
    recipe = summary["best_time"][name]
    method, muon_lr = lm.RECIPES[recipe][1], summary["equal_time"][recipe]["lr"]
    train_tokens, test_half = load_split(data_dir, "train"), lm.halves(data_dir)[1]
    # the span's tokens: the rarer half of the vocabulary, so that the current token mostly finds its one earlier
    # occurrence in the span (common characters would match all over the text between the copies)
    alphabet = torch.from_numpy(np.bincount(train_tokens, minlength=vocab).argsort()[:vocab // 2].copy())
    torch.manual_seed(SEED)
    model = build_model(repeat_model(summary, name, T)).to(ctx.device)
    # as the lm experiment trains: warmup then cosine to lr/10, the same steps for both models
    train_cfg = TrainConfig(learning_rate=lr, min_lr=lr / 10, max_iters=steps, warmup_iters=steps // 10,
                            optimizer=method, **(dict(muon_lr=muon_lr) if method == "muon" else {}))
    optimizer = make_optimizer(model, train_cfg, ctx.device)
    generator, start, train_ds = torch.Generator().manual_seed(SEED), time.time(), training_distances(distances)
    for it in tqdm(range(steps), desc=f"context: repeat corpus, {name}", leave=False):
        set_lr(optimizer, get_lr(it, train_cfg))
        x, y, _, at = repeat_batch(train_tokens, budget["batch_size"], train_ds, span, T, alphabet, generator)
        y = copyable(y, at, span)  # a brief run spends every gradient on the copy (the text's loss: the lm experiment)
        train_step(model, optimizer, [(x.to(ctx.device), y.to(ctx.device))], grad_clip=train_cfg.grad_clip)
    seconds, generator = time.time() - start, torch.Generator().manual_seed(SEED + 1)
    model.eval()
    scores = {D: repeat_scores(model, *repeat_batch(test_half, budget["test_sequences"], [D], span, T, alphabet,
                                                    generator), span) for D in distances}
    recipe_setting, grid_lr = (f"muon adamw_lr={lr:g}", muon_lr) if method == "muon" else ("adamw", lr)
    for D, score in scores.items():
        for metric in ("repeat", "first"):
            ctx.grid_point("context", name, f"repeat D={D} span={span} context={T} {recipe_setting}", grid_lr, SEED,
                           steps, seconds,
                           f"{'repeated' if metric == 'repeat' else 'first'} span test loss", round(score[metric], 4))
    return dict(scores=scores, steps=steps, seconds=seconds, lr=lr, muon_lr=muon_lr, optimizer=method, T=T)


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


# the smallest loss difference that counts (10% in perplexity): a few hundredths of a nat can come from a model
# raising every token it has just seen, a cache rather than a look-up of what came next
MATERIAL = 0.1


def copied(score, uniform):
    """Whether the repeat costs less than both the first copy and a uniform guess over the span's alphabet (uniform,
    nats) by more than MATERIAL and twice the repeat's standard error: a model that is confidently wrong on the first
    copy has not copied by beating it alone."""
    return min(score["first"], uniform) - score["repeat"] > max(2 * score["se"], MATERIAL)


def decide(gpt, lstm, gpt_copies, lstm_copies):
    """The verdict from the repeat's loss by D (ascending), each model's [(loss, standard error)], and how many of
    the distances each model copies at: shown where the LSTM is worse than the GPT at the longest D and either copies
    at fewer distances or its loss rises from the shortest to the longest D more than the GPT's, each by more than
    MATERIAL and twice their standard errors; contradicted where the LSTM is better at the longest D by more than
    that; not shown otherwise."""
    gap = lstm[-1][0] - gpt[-1][0]
    gap_noise = max(2 * math.hypot(gpt[-1][1], lstm[-1][1]), MATERIAL)
    rise = (lstm[-1][0] - lstm[0][0]) - (gpt[-1][0] - gpt[0][0])
    rise_noise = max(2 * math.sqrt(sum(se ** 2 for _, se in (gpt[0], gpt[-1], lstm[0], lstm[-1]))), MATERIAL)
    if gap < -gap_noise:
        return "contradicted here"
    if gap > gap_noise and (lstm_copies < gpt_copies or rise > rise_noise):
        return "shown here"
    return "not shown here"


def context_rows(ctx, budget, summary, rises, repeats):
    T, ks = summary["block_size"], ks_for(summary["block_size"])
    seeds = ", ".join(str(r["seed"]) for r in summary["gpt"]["runs"])
    def cell(name):
        return " / ".join(f"{v:+.3f}" for v in rises[name].mean(0).tolist()[:-1])
    effective = {name: effective_context(ks, rises[name]) for name in rises}
    ctx.row("context", "loss rise at the last position, tokens more than k back replaced, k = "
            + " / ".join(map(str, ks[:-1])), cell("gpt"), cell("lstm"),
            f"the lm experiment's models (context {T}), mean of seeds {seeds}; replaced by draws from the train "
            f"split's unigram distribution (Khandelwal et al. 2018), the same draws for every model; "
            f"{budget['windows']} test windows (val 2nd half) scored at position {T}")
    ctx.row("context", f"effective context (k from which on the rise is within the seeds' min-max range), of {T}",
            str(effective["gpt"]), str(effective["lstm"]),
            "the seeds' range of the rise: gpt " + " / ".join(f"{v:.3f}" for v in spread(rises["gpt"])[:-1])
            + ", lstm " + " / ".join(f"{v:.3f}" for v in spread(rises["lstm"])[:-1])
            + (f"; at k = {T} nothing is replaced" if effective["gpt"] == T or effective["lstm"] == T else ""))
    distances, span = budget["distances"], budget["span"]
    def losses(name, key):
        return " / ".join(f"{repeats[name]['scores'][D][key]:.3f}" for D in distances)
    trained = "; ".join(f"{name} {recipe_note(repeats[name])}, {repeats[name]['steps']} steps in "
                        f"{repeats[name]['seconds']:.0f} s" for name in ("gpt", "lstm"))
    uniform = math.log(summary["vocab"] // 2)
    ctx.row("context", f"loss on a repeated span of {span} random tokens at D = " + " / ".join(map(str, distances)),
            losses("gpt", "repeat"), losses("lstm", "repeat"),
            f"each model trained on text (the lm corpus) with a span repeated at a distance drawn log-uniform from "
            f"{min(distances)}-{max(distances)}, scored at each D on the repeat's "
            f"copyable {span - 1} tokens only, context "
            f"{repeats['gpt']['T']}, {budget['batch_size']} sequences a step, seed {SEED}; {trained}; the first "
            f"copy costs gpt {losses('gpt', 'first')}, lstm {losses('lstm', 'first')} (a uniform guess over the span's "
            f"alphabet, the vocabulary's rarer half: {uniform:.2f}); "
            f"{budget['test_sequences']} test sequences a D (val 2nd half), "
            f"standard error up to {max(s['se'] for r in repeats.values() for s in r['scores'].values()):.3f}")
    by_d = {name: [(repeats[name]["scores"][D]["repeat"], repeats[name]["scores"][D]["se"]) for D in distances]
            for name in ("gpt", "lstm")}
    copies = {name: [D for D in distances if copied(repeats[name]["scores"][D], uniform)] for name in ("gpt", "lstm")}
    status = decide(by_d["gpt"], by_d["lstm"], len(copies["gpt"]), len(copies["lstm"]))
    lo, hi = distances[0], distances[-1]
    copy_note = "; ".join(f"{name} copies (repeat below the first copy and the uniform guess by > 2 standard errors "
                          f"and > {MATERIAL} "
                          "nats) at D = " + (", ".join(map(str, Ds)) if Ds else "none") for name, Ds in copies.items())
    evidence = (f"on the repeated span the LSTM's loss goes {by_d['lstm'][0][0]:.3f} -> {by_d['lstm'][-1][0]:.3f} "
                f"nats from D = {lo} to {hi}, the GPT's {by_d['gpt'][0][0]:.3f} -> {by_d['gpt'][-1][0]:.3f} "
                f"(a difference counts beyond twice the standard errors and {MATERIAL} nats); effective context on "
                f"text {effective['gpt']} (gpt) / {effective['lstm']} (lstm) of {T}")
    gap = by_d["lstm"][-1][0] - by_d["gpt"][-1][0]
    ctx.row("context", f"gap at D = {hi}, LSTM - GPT, repeated span", f"{gap:+.3f}", "-",
            f"{evidence}; {copy_note}; that the LSTM uses long context worse than attention is {status}")
    ctx.verdict("context", "b", evidence, status)


def recipe_note(run):
    """The repeat run's optimizer and lrs, the lm experiment's equal-time choice."""
    muon = run["optimizer"] == "muon"
    lrs = f"muon_lr {run['muon_lr']:g}, AdamW part at lr {run['lr']:g}" if muon else f"lr {run['lr']:g}"
    return f"{run['optimizer']} ({lrs}; its best recipe at equal time in the lm experiment)"


def spread(rises):
    """The seeds' min-max range at each k."""
    return (rises.max(0).values - rises.min(0).values).tolist()


def context_figure(ctx, budget, summary, rises, repeats):
    ks = ks_for(summary["block_size"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        r = rises[name]
        mean = r.mean(0)
        a.errorbar(ks, mean, yerr=(mean - r.min(0).values, r.max(0).values - mean), fmt="o-", ms=3, capsize=3,
                   color=color, label=f"{name} ({len(r)} seeds, min-max)")
        a.axvline(effective_context(ks, r), color=color, ls=":", lw=1)
        distances = budget["distances"]
        scores = repeats[name]["scores"]
        b.errorbar(distances, [scores[D]["repeat"] for D in distances], yerr=[2 * scores[D]["se"] for D in distances],
                   fmt="o-", capsize=3, color=color, label=f"{name}: repeated span")
        b.plot(distances, [scores[D]["first"] for D in distances], "--", color=color, lw=1,
               label=f"{name}: first copy")
    a.set_xscale("log", base=2)
    a.set_xticks(ks, [str(k) for k in ks])
    a.axhline(0, color="gray", lw=0.8)
    a.set(xlabel="k (tokens kept before the scored one)", ylabel="loss rise over the full window (nats)",
          title="lm models: context beyond k replaced (dotted: effective)")
    b.axhline(math.log(summary["vocab"] // 2), color="gray", ls=":", lw=1, label="a uniform guess over the alphabet")
    b.set_xscale("log", base=2)
    b.set_xticks(budget["distances"], [str(D) for D in budget["distances"]])
    b.set(xlabel="distance D between the span and its repeat", ylabel="test loss on the span (nats/token)",
          title="repeat corpus (bars: 2 standard errors)")
    for ax in (a, b):
        ax.legend(fontsize=7)
    ctx.save(fig, "context.png", f"left: {lm.lm_detail(summary)}\nright: the same shapes at context "
             f"{repeats['gpt']['T']}, trained {budget['steps']} steps x {budget['batch_size']} "
             f"sequences on the repeat corpus (D log-uniform in {min(budget['distances'])}-"
             f"{max(budget['distances'])}), span {budget['span']}, seed {SEED}")
