"""Language modelling, every model trained by `python train.py` on one corpus at one context length: a GPT against an
LSTM of the same size at equal tokens (both on AdamW) and at equal wall time (each with its best recipe: the GPT with
Muon on its blocks' matrices, the LSTM with AdamW or with Muon on its matrices, whichever selects better), bigram and
trigram baselines, the loss at each position of the context (does the LSTM stop using context after ~100 tokens while
the transformer keeps improving, as Kaplan et al. 2020 found in their figure 7?); the GPT's position schemes, also run
at twice their training length; and sliding-window attention against full attention.

Protocol: each model's learning rate is chosen on the first half of the corpus's val split (the selection loss of the
final weights) and every number reported comes from the second half (the test loss); at equal tokens both models get
the same steps, batch and schedule (warmup, cosine decay to lr/10 at the cap); at equal wall time every run gets the
same train.time_budget_s (the GPT's mean wall time at equal tokens), over which its lr decays, so each run ends its
schedule. train.py has no early stop; a run that was still improving at its end (by more than PLATEAU_NATS over its
last quarter) is flagged in the rows. Spreads are min-max over the seeds.
Runs live in out/compare/<experiment>/; out/compare/lm/summary.json holds the lm experiment's choices, which the
positions, window, paths and text experiments read (lm_summary, best_run).
"""
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from attnlab.checkpoint import build_model, load_checkpoint
from attnlab.config import compose
from attnlab.record import read_metrics
from data.corpus import load_meta, load_split, prepare
from scripts.report import RUNS
from scripts.report.protocol import seed_grid
from scripts.report.tasks import rnn_width

# gpt: the GPT as train.py overrides (the LSTM is configs/model/lstm.yaml at the width matching its parameter count);
# block_size, batch_size, steps: the same context, sequences per step and step cap for every equal-token run; lrs:
# each model's AdamW grid; muon_lrs: each model's train.muon_lr grid at equal wall time (its AdamW part at the model's
# tuned lr); grid_seeds: the seeds every grid point is trained with, seeds: those the chosen lr is trained with;
# evals, eval_iters: train.py's val estimates per step cap and batches per estimate (the curves); select_windows,
# test_windows: windows of block_size scored on each half of the val split (None: all); windows: model.window sizes.
# Run counts (3 seeds): lm 10 at equal tokens + 13 at equal time, positions 9, window 3 per size, about 35 in all,
# each a train.py start-up, its training and the scoring; docs/report.md has the wall times.
# 8 x 256 tokens a step is train.py's default 16 x 128. The full grids are centred on the quick run's choices (GPT
# 3e-3 and muon_lr 0.04, LSTM 1e-2 and 0.16); seed_grid widens any grid whose best is at an end.
BUDGET = {
    "quick": dict(gpt=["model.n_layer=2", "model.n_head=2", "model.n_embd=64"], block_size=256, batch_size=8,
                  steps=128, lrs=dict(gpt=[1.5e-3, 3e-3, 6e-3], lstm=[5e-3, 1e-2, 2e-2]),
                  muon_lrs=dict(gpt=[0.02, 0.04, 0.08], lstm=[0.04, 0.08, 0.16]), grid_seeds=1, seeds=3, evals=4,
                  eval_iters=4, select_windows=128, test_windows=512, windows=[64]),
    "full": dict(gpt=["model.n_layer=3", "model.n_head=3", "model.n_embd=96"], block_size=256, batch_size=8,
                 steps=256, lrs=dict(gpt=[1.5e-3, 3e-3, 6e-3], lstm=[5e-3, 1e-2, 2e-2]),
                 muon_lrs=dict(gpt=[0.02, 0.04, 0.08], lstm=[0.08, 0.16, 0.32]),
                 grid_seeds=1, seeds=3, evals=4, eval_iters=4, select_windows=256, test_windows=None, windows=[64]),
}
ROOT = Path(__file__).resolve().parents[2]  # the repository root, where train.py runs
PLATEAU_NATS = 0.01  # a run whose val loss fell by more than this over its last quarter was still improving at the end
SCHEMES = ("rope", "learned", "sinusoidal", "none")  # model.pos; the lm experiment's GPT is the rope one
# the equal-wall-time recipes: (model, train.optimizer); the GPT takes the project's levers, the LSTM both optimizers
RECIPES = {"gpt muon": ("gpt", "muon"), "lstm adamw": ("lstm", "adamw"), "lstm muon": ("lstm", "muon")}
ADD_K = (1e-3, 1e-2, 0.1, 1.0)  # the n-gram baselines' add-k smoothing, chosen on the selection half like an lr
MAX_ITERS_PER_CAP = 50  # a time-budget run's step cap, in step caps: far enough that the seconds end it


def exp_lm(ctx):
    """The GPT against the LSTM of the same size, each tuned alike, at equal tokens and equal time; loss by position."""
    shutil.rmtree(RUNS / "lm", ignore_errors=True)  # scripts/report owns these runs; train.py never overwrites
    summary = setup(ctx)
    for name in ("gpt", "lstm"):
        summary[name] |= tune(ctx, summary, name)
    # at least 0.1 s: a budget rounded to 0 would mean no budget (runs shorter than that are tiny test models)
    summary["budget_s"] = max(0.1, round(float(np.mean([r["seconds"] for r in summary["gpt"]["runs"]])), 1))
    summary["equal_time"] = {recipe: tune(ctx, summary, name, optimizer, summary["budget_s"])
                             for recipe, (name, optimizer) in RECIPES.items()}
    summary["best_time"] = best_recipes(summary["equal_time"])
    summary["ngram"] = ngram_baselines(summary["data_dir"], summary["vocab"])
    (RUNS / "lm" / "summary.json").write_text(json.dumps(summary, indent=1))
    curves = {name: torch.tensor([r["by_position"] for r in summary[name]["runs"]]) for name in ("gpt", "lstm")}
    lm_rows(ctx, summary, curves)
    ctx.verdict("lm", "b", *lm_verdict(summary))
    lm_figure(ctx, summary, curves)


def lm_rows(ctx, summary, curves):
    """The results table's lm rows; curves: each model's test loss by position at equal tokens, (seeds, T)."""
    gpt, lstm, ngram = summary["gpt"], summary["lstm"], summary["ngram"]
    T, tokens = summary["block_size"], summary["steps"] * summary["batch_size"] * summary["block_size"]
    ctx.row("lm", "models", f"{gpt['desc']}, {gpt['params']:,} params", f"{lstm['desc']}, {lstm['params']:,} params",
            f"corpus {summary['corpus']} ({summary['vocab']} tokens; a unigram model, which ignores the context, "
            f"scores {summary['unigram']:.2f} nats on the train split); context {T} for both; {summary['batch_size']} "
            f"sequences a step; fp32")
    ctx.row("lm", f"test loss at equal tokens ({tokens / 1e6:.2f}M), AdamW for both, final weights",
            spread([r["test"] for r in gpt["runs"]]), spread([r["test"] for r in lstm["runs"]]),
            f"{summary['steps']} steps each; {lr_note(gpt, 'gpt')}; {lr_note(lstm, 'lstm')}; {seeds_note(summary)}; "
            f"{improving_note(gpt['runs'], lstm['runs'])}; {ngram_note(ngram)}")
    best = {name: summary["equal_time"][recipe] for name, recipe in summary["best_time"].items()}
    ctx.row("lm", f"test loss at equal wall time ({summary['budget_s']:g} s of training), each model's best recipe",
            spread([r["test"] for r in best["gpt"]["runs"]]), spread([r["test"] for r in best["lstm"]["runs"]]),
            f"train.time_budget_s={summary['budget_s']:g} for every run (the GPT's mean wall time at equal tokens), "
            f"the lr decaying over it; {recipes_note(summary)}; {seeds_note(summary)}; "
            f"{improving_note(best['gpt']['runs'], best['lstm']['runs'])}")
    ctx.row("lm", f"tokens seen in {summary['budget_s']:g} s (M)", *(
        spread([r["iters"] * summary["batch_size"] * T / 1e6 for r in best[name]["runs"]], 2) for name in best),
            f"{summary['best_time']['gpt']} / {summary['best_time']['lstm']}; {ctx.hardware}, one run at a time")
    ctx.row("lm", "wall seconds to the step cap at equal tokens (training and train.py's evaluations)",
            spread([r["seconds"] for r in gpt["runs"]], 0), spread([r["seconds"] for r in lstm["runs"]], 0),
            f"{ctx.hardware}, one run at a time")
    bins = position_bins(T)
    def at(c):
        return " / ".join(spread(v, 3) for v in bin_means(c, bins).T.tolist())  # c: (seeds, T)
    ctx.row("lm", "test loss at positions " + " / ".join(f"{a}-{b}" for a, b in bins), at(curves["gpt"]),
            at(curves["lstm"]), f"equal tokens; {seeds_note(summary)}; the test half in windows of {T}, the same for "
            f"both models; " + "; ".join(f"{name}: {position_note(curves[name], bins)}" for name in curves))
    ctx.row("lm", f"loss change from positions 65-128 to 129-{T}" if T >= 256 else "loss change past position 128",
            *(f"{change(curves[name], (65, 128), (129, T))[0]:+.3f}" if T >= 256 else "-" for name in curves),
            kaplan_note(curves, T))


def setup(ctx):
    """The shared settings and both models as train.py overrides: the preset's GPT, and configs/model/lstm.yaml at
    the width (report.tasks.rnn_width) that gives it the GPT's parameter count on this corpus's vocabulary."""
    budget = BUDGET[ctx.preset]
    data = ["data=text", f"data.path={ctx.data_path}"] if ctx.data_path else []
    shape = [f"model.block_size={budget['block_size']}"]
    gpt = compose(*budget["gpt"], *shape, *data)
    data_dir = prepare(gpt.data, budget["block_size"])  # once, before the runs, which then find it prepared
    vocab = load_meta(data_dir)["vocab_size"]
    params = build_model(replace(gpt.model, vocab_size=vocab)).num_params()
    lstm = replace(compose("model=lstm", *shape).model, vocab_size=vocab)
    lstm = replace(lstm, n_embd=rnn_width(params, vocab, lstm.n_layer, tied=lstm.tie_weights))
    summary = dict(preset=ctx.preset, corpus=corpus_name(ctx), vocab=vocab, data_dir=str(data_dir),
                   unigram=unigram_entropy(data_dir),
                   **{key: budget[key] for key in ("block_size", "batch_size", "steps", "grid_seeds", "seeds")})
    models = {"gpt": (gpt.model, budget["gpt"]), "lstm": (lstm, ["model=lstm", f"model.n_embd={lstm.n_embd}"])}
    for name, (cfg, overrides) in models.items():
        desc = f"{cfg.n_layer}x{cfg.n_embd} " + (f"GPT, {cfg.n_head} heads" if name == "gpt" else "LSTM")
        summary[name] = dict(overrides=[*overrides, *shape, *data], desc=desc, n_layer=cfg.n_layer,
                             data_dir=str(data_dir), params=build_model(replace(cfg, vocab_size=vocab)).num_params())
    return summary


def tune(ctx, summary, name, optimizer="adamw", seconds=0.0):
    """Train every lr of a grid with the grid seeds, choose the lr of the lowest mean selection loss, train it with
    the remaining seeds. At equal tokens (seconds 0) the grid is the model's AdamW lrs; at equal time the AdamW
    recipe keeps the lr tuned at equal tokens and the Muon one tries the model's muon_lrs (its AdamW part at that lr).
    Returns the lr, whether it lies at an end of the grid, the grid tried and the chosen runs."""
    budget, T = BUDGET[ctx.preset], summary["block_size"]
    if not seconds:
        lrs, setting = budget["lrs"][name], f"context={T}"
        def run(lr, seed):
            return fit(ctx, summary, "lm", name, setting, [], lr, seed)
    else:
        lrs = budget["muon_lrs"][name] if optimizer == "muon" else [summary[name]["lr"]]
        setting = f"context={T} {optimizer} time={seconds:g}s" + (
            f" adamw_lr={summary[name]['lr']:g}" if optimizer == "muon" else "")
        def run(lr, seed):
            adamw_lr = summary[name]["lr"] if optimizer == "muon" else lr
            return fit(ctx, summary, "lm", name, setting, [], adamw_lr, seed, optimizer=optimizer, muon_lr=lr,
                       seconds=seconds)
    def mean_select(runs):
        return float(np.mean([r["select"] for r in runs]))
    best, lrs, grid, runs = seed_grid(run, lrs, list(range(budget["seeds"])), budget["grid_seeds"],
                                      lambda runs: -mean_select(runs))
    selection = [(lr, mean_select([grid[lr, seed] for seed in range(budget["grid_seeds"])])) for lr in lrs]
    print(f"lm: {name} {optimizer} {'at ' + format(seconds, 'g') + ' s' if seconds else 'at equal tokens'}: lr grid "
          f"tried [{', '.join(f'{lr:g}' for lr in lrs)}], chosen {best:g}")
    return dict(lr=best, edge=len(lrs) > 1 and best in (min(lrs), max(lrs)), grid=selection, optimizer=optimizer,
                runs=list(runs.values()), select=mean_select(list(runs.values())))


def best_recipes(equal_time):
    """Each model's recipe at equal time: the one of lowest mean selection loss over its chosen lr's seeds."""
    return {name: min((r for r, (n, _) in RECIPES.items() if n == name), key=lambda r: equal_time[r]["select"])
            for name in ("gpt", "lstm")}


def fit(ctx, summary, experiment, name, setting, extra, lr, seed, optimizer="adamw", muon_lr=0.02, seconds=0.0,
        budget=None):
    """One configuration trained by train.py, then scored on its final weights: the selection loss, and the test loss
    at each position. Both go to the grid table (lr: muon_lr for a Muon run); returns the run's record. seconds > 0
    trains for that time budget (train.time_budget_s) instead of to the step cap, the lr decaying over it. budget:
    the evaluation keys (evals, eval_iters, select_windows, test_windows) of another experiment, else this one's."""
    budget, steps = budget or BUDGET[ctx.preset], summary["steps"]
    grid_lr = muon_lr if optimizer == "muon" else lr
    out = RUNS / experiment / f"{name}-{setting.replace('=', '').replace(' ', '-')}-lr{grid_lr:g}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    # fp32 for both (auto would take bf16 where it is native); evaluations every cap/evals steps in both protocols
    timed = [f"train.time_budget_s={seconds}", f"train.max_iters={MAX_ITERS_PER_CAP * steps}"] if seconds else [
        f"train.max_iters={steps}"]
    train_run([*summary[name]["overrides"], *extra, f"train.batch_size={summary['batch_size']}",
               f"train.device={ctx.device}", "train.dtype=float32", f"train.optimizer={optimizer}",
               f"train.learning_rate={lr}", f"train.min_lr={lr / 10}", f"train.muon_lr={muon_lr}", *timed,
               f"train.warmup_iters={steps // 10}", f"train.eval_interval={max(1, steps // budget['evals'])}",
               f"train.eval_iters={budget['eval_iters']}", f"train.seed={seed}",
               f"logger.log_interval={max(1, steps // 20)}", f"out_dir={out}"])
    evals = read_metrics(out, "eval")
    select_half, test_half = halves(summary["data_dir"])
    model, T = final_model(out, device=ctx.device), summary["block_size"]
    select = position_losses(model, select_half, T, budget["select_windows"]).mean().item()
    test = position_losses(model, test_half, T, budget["test_windows"])
    earlier = [r for r in evals if r["iter"] <= 0.75 * evals[-1]["iter"]][-1]  # the start of the last quarter
    run = dict(out=str(out), lr=lr, muon_lr=muon_lr, optimizer=optimizer, seed=seed, iters=evals[-1]["iter"],
               seconds=evals[-1]["elapsed_s"], curve=[(r["elapsed_s"], r["val_loss"]) for r in evals],
               select=select, test=test.mean().item(), by_position=[round(v, 4) for v in test.tolist()],
               improving=earlier["val_loss"] - evals[-1]["val_loss"] > PLATEAU_NATS)
    for metric in ("select", "test"):
        ctx.grid_point(experiment, name, setting, grid_lr, seed, run["iters"], run["seconds"],
                       "selection loss" if metric == "select" else "test loss", round(run[metric], 4))
    return run


def train_run(overrides):
    """`python train.py OVERRIDES` from this working directory (relative paths mean what they mean here), on this
    process's torch threads; its progress and errors print as they come."""
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    if subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], env=env).returncode:
        sys.exit(f"compare: `python train.py {' '.join(overrides)}` failed; its error is above")


def unigram_entropy(data_dir):
    """Nats per token of the train split's token frequencies: the loss of a model that ignores the context."""
    counts = np.bincount(load_split(data_dir, "train"))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def ngram_counts(train, tokens, n, vocab):
    """For each token of tokens after its first n - 1: how often train holds it after the same n - 1 tokens, and how
    often train holds those n - 1 tokens followed by anything. Each n-gram is one integer, base vocab."""
    def ids(seq, order):
        seq, out = seq.astype(np.int64), np.zeros(len(seq) - order + 1, dtype=np.int64)
        for i in range(order):
            out = out * vocab + seq[i:len(seq) - order + 1 + i]
        return out
    def lookup(seq, order, queries):
        keys, counts = np.unique(ids(seq, order), return_counts=True)
        at = np.searchsorted(keys, queries).clip(max=len(keys) - 1)
        return np.where(keys[at] == queries, counts[at], 0)
    grams = ids(tokens, n)
    return lookup(train, n, grams), lookup(train[:-1], n - 1, grams // vocab)


def ngram_loss(joint, context, vocab, k):
    """Nats per token of add-k smoothing, p(token | previous n - 1) = (joint + k) / (context + k vocab)."""
    return float(-np.log((joint + k) / (context + k * vocab)).mean())


def ngram_baselines(data_dir, vocab):
    """Bigram and trigram models counted on the train split, add-k with k chosen on the selection half, scored on
    every token of the test half: {n: (k, test nats/token)}."""
    train, (select_half, test_half) = load_split(data_dir, "train"), halves(data_dir)
    result = {}
    for n in (2, 3):
        select, test = ngram_counts(train, select_half, n, vocab), ngram_counts(train, test_half, n, vocab)
        k = min(ADD_K, key=lambda k: ngram_loss(*select, vocab, k))
        result[n] = (k, ngram_loss(*test, vocab, k))
    return result


def halves(data_dir):
    """The val split's first half (selection: choosing the lr) and second half (test: every reported number)."""
    val = load_split(data_dir, "val")
    return val[:len(val) // 2], val[len(val) // 2:]


def final_model(out, block_size=None, device="cpu"):
    """A run's final weights (ckpt.pt) in eval mode, optionally in a model built for another context length: RoPE and
    sinusoidal tables are rebuilt for it (they are not saved), learned position embeddings cannot be."""
    ckpt = load_checkpoint(Path(out) / "ckpt.pt")
    model = build_model({**ckpt["model_config"], **({"block_size": block_size} if block_size else {})})
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval()


@torch.no_grad()
def position_losses(model, tokens, T, windows=None, batch_size=32):
    """Mean loss at each position 1..T, (T,), over non-overlapping windows of tokens (evenly spaced ones where
    windows caps their number)."""
    available = (len(tokens) - 1) // T
    if available < 1:
        raise ValueError(f"{len(tokens)} tokens hold no window of {T + 1}; use a longer corpus or a shorter context")
    starts = np.linspace(0, available - 1, min(available, windows or available)).astype(int) * T
    device, total = next(model.parameters()).device, 0.0
    for i in tqdm(range(0, len(starts), batch_size), desc=f"scoring {len(starts)} windows", leave=False):
        rows = tokens[starts[i:i + batch_size, None] + np.arange(T + 1)]  # (B, T + 1)
        batch = torch.from_numpy(rows.astype(np.int64)).to(device)
        logits = model(batch[:, :-1])[0]  # (B, T, vocab)
        total += F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none").sum(0)  # (T,)
    return (total / len(starts)).cpu()


def half_octaves(curves):
    """Bins of positions that widen with the position, starting at 1, 2, 3, 4, 6, 8, 11, 16, 23, ... (2^(k/2)
    rounded), so that the late ones, where the loss changes slowly, average over many tokens: (bin starts, the mean
    of curves (..., T) over each bin (..., bins))."""
    T = curves.size(-1)
    starts = sorted({round(2 ** (k / 2)) for k in range(int(2 * math.log2(T)) + 1)} - {T})
    ends = [*starts[1:], T + 1]
    return starts, torch.stack([curves[..., a - 1:b - 1].mean(-1) for a, b in zip(starts, ends)], -1)


def position_bins(T):
    """The reported bins of positions, inclusive: 1-8, 9-64, 65-T (those that fit in T)."""
    ends = [e for e in (8, 64) if e < T] + [T]
    return list(zip([1, *[e + 1 for e in ends[:-1]]], ends))


def bin_means(curves, bins):
    """Each seed's mean loss over each bin: curves (seeds, T) -> (seeds, bins)."""
    return torch.stack([curves[:, a - 1:b].mean(1) for a, b in bins], 1)


def change(curves, early, late):
    """(the seeds' mean loss change from bin early to bin late, the seed spread it must exceed to count: the larger
    of the two bins' min-max ranges over the seeds); curves (seeds, T), bins (first, last) inclusive."""
    means = bin_means(curves, [early, late])  # (seeds, 2)
    noise = (means.max(0).values - means.min(0).values).max().item()
    return (means[:, 1] - means[:, 0]).mean().item(), noise


def position_note(curves, bins):
    """How the loss changes from bin to bin against the seed spread, and the last position past which it falls."""
    steps = [(early, late, *change(curves, early, late)) for early, late in zip(bins, bins[1:])]
    parts = [f"{a}-{b} to {c}-{d} {delta:+.3f} (seed spread {noise:.3f})" for (a, b), (c, d), delta, noise in steps]
    gains = [i for i, (*_, delta, noise) in enumerate(steps) if -delta > noise]
    rises = [f"{c}-{d}" for (_, (c, d), delta, noise) in steps if delta > noise]
    if gains and gains[-1] == len(steps) - 1:
        verdict = f"still falls past position {bins[-1][0] - 1} above the seed spread"
    else:
        verdict = f"no gain past position {bins[gains[-1] + 1][1] if gains else bins[0][1]} detectable above the " \
                  f"seed spread"
    return ", ".join(parts) + f": {verdict}" + (f"; rises at {', '.join(rises)} above the spread" if rises else "")


def kaplan_note(curves, T):
    """Kaplan et al. 2020's figure 7 (the LSTM flat after ~100 tokens, the transformer still improving), read from
    the loss change between positions 65-128 and 129-T against the seed spread."""
    if T < 256:
        return f"a context of {T} is too short to test Kaplan et al. 2020's ~100-token finding"
    falls = {}
    for name, c in curves.items():
        delta, noise = change(c, (65, 128), (129, T))
        falls[name] = -delta > noise
    numbers = "; ".join(f"{n} {change(c, (65, 128), (129, T))[0]:+.3f} (seed spread "
                        f"{change(c, (65, 128), (129, T))[1]:.3f})" for n, c in curves.items())
    if falls["gpt"] and not falls["lstm"]:
        reading = "as Kaplan et al. 2020 (fig. 7) found: the GPT still gains past position 128, the LSTM does not"
    elif falls["gpt"] and falls["lstm"]:
        reading = "unlike Kaplan et al. 2020 (fig. 7), the LSTM too still gains past position 128"
    elif falls["lstm"]:
        reading = "the opposite of Kaplan et al. 2020 (fig. 7): the LSTM gains past position 128, the GPT does not"
    else:
        reading = ("neither model gains past position 128 above the seed spread, so Kaplan et al. 2020's (fig. 7) "
                   "contrast cannot show at this scale")
    return f"{reading}; {numbers}; a gain counts when the loss falls by more than the seed spread"


def beats(a, b):
    """Whether the losses a are lower than b by more than the seed spread (the larger min-max range of the two)."""
    return np.mean(b) - np.mean(a) > max(max(a) - min(a), max(b) - min(b))


def lm_verdict(summary):
    """(evidence, status) for reason (b)'s loss part at this scale: shown where the GPT beats the LSTM at equal tokens
    and at equal wall time (each at its best recipe) by more than the seed spread; contradicted where the LSTM beats
    the GPT in one of them and loses in neither; otherwise not shown."""
    best = {name: summary["equal_time"][recipe]["runs"] for name, recipe in summary["best_time"].items()}
    tests = {"equal tokens": {name: [r["test"] for r in summary[name]["runs"]] for name in ("gpt", "lstm")},
             f"equal wall time ({summary['budget_s']:g} s)": {name: [r["test"] for r in best[name]] for name in best}}
    winners, parts = {}, []
    for when, loss in tests.items():
        winners[when] = next((a for a, b in (("gpt", "lstm"), ("lstm", "gpt")) if beats(loss[a], loss[b])), None)
        outcome = f"{winners[when]} lower by more than the seed spread" if winners[when] else "within the seed spread"
        parts.append(f"{when}: test loss gpt {spread(loss['gpt'])} vs lstm {spread(loss['lstm'])}, {outcome}")
    n, (_, floor) = min(summary["ngram"].items(), key=lambda item: item[1][1])
    below = {when: [name for name in ("gpt", "lstm") if np.mean(loss[name]) < floor] for when, loss in tests.items()}
    parts.append(f"the {'bigram' if int(n) == 2 else 'trigram'} baseline scores {floor:.3f}, beaten on the mean at "
                 + ", ".join(f"{when} by {' and '.join(names) or 'neither'}" for when, names in below.items()))
    evidence = "; ".join(parts) + f" (min-max over seeds {seeds_range(summary)}; the loss part of (b), at this scale)"
    if all(w == "gpt" for w in winners.values()):
        return evidence, "shown here"
    if "lstm" in winners.values() and "gpt" not in winners.values():
        return evidence, "contradicted here"
    return evidence, "not shown here"


def spread(values, digits=3):
    """Seeds' mean [min, max]."""
    return f"{np.mean(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def lr_note(model, name, key="lr"):
    """The chosen lr among the grid actually tried (seed_grid may have widened it)."""
    grid = ", ".join(f"{lr:g}" for lr, _ in model["grid"])
    return f"{name} {key} {model['lr']:g} of [{grid}] tried" + (" (an end of the grid: the best may lie beyond)"
                                                                 if model["edge"] else "")


def seeds_range(summary):
    seeds = sorted(r["seed"] for r in summary["gpt"]["runs"])
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])


def seeds_note(summary):
    return f"mean [min, max] over seeds {seeds_range(summary)}"


def improving_note(gpt_runs, lstm_runs):
    still = [sum(r["improving"] for r in runs) for runs in (gpt_runs, lstm_runs)]
    return (f"still improving at the end (> {PLATEAU_NATS} nats over the last quarter): gpt {still[0]} of "
            f"{len(gpt_runs)} seeds, lstm {still[1]} of {len(lstm_runs)}")


def ngram_note(ngram):
    return ("n-gram baselines (counted on the train split) on every token of the test half: " + ", ".join(
        f"{'bigram' if int(n) == 2 else 'trigram'} {loss:.3f} (add-k, k={k:g} chosen on the selection half)"
        for n, (k, loss) in ngram.items()) + " nats")


def recipes_note(summary):
    """Each equal-time recipe's lr, grid and selection loss, and which of each model's recipes was chosen."""
    parts = []
    for recipe, (name, optimizer) in RECIPES.items():
        r = summary["equal_time"][recipe]
        lr = (lr_note(r, recipe, "muon_lr") + f" (its AdamW part at lr {summary[name]['lr']:g})"
              if optimizer == "muon" else f"{recipe} lr {r['lr']:g} (tuned at equal tokens)")
        chosen = " (chosen)" if summary["best_time"][name] == recipe else ""
        test = spread([x["test"] for x in r["runs"]])
        parts.append(f"{lr}, mean selection loss {r['select']:.3f}{chosen}, test {test}")
    return "; ".join(parts)


def capped_note(runs):
    """How many of the runs {setting: [run]} were still improving at the cap."""
    every = [r for rs in runs.values() for r in rs]
    return f"{sum(r['improving'] for r in every)} of {len(every)} runs still improving at the cap"


def lm_figure(ctx, summary, curves):
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 3.8))
    T = summary["block_size"]
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        model, timed = summary[name], summary["equal_time"][summary["best_time"][name]]
        a.semilogx(*zip(*model["grid"]), "o-", color=color, label=f"{name} AdamW lr, equal tokens")
        a.plot(model["lr"], dict(model["grid"])[model["lr"]], "*", ms=12, color=color)
        for recipe, (n, optimizer) in RECIPES.items():
            if n == name and optimizer == "muon":
                r = summary["equal_time"][recipe]
                a.semilogx(*zip(*r["grid"]), "s--", color=color, label=f"{name} muon_lr, equal time")
                a.plot(r["lr"], dict(r["grid"])[r["lr"]], "*", ms=12, color=color)
        for r in model["runs"]:
            b.plot(*zip(*r["curve"]), "-", lw=1, color=color, label=f"{name} AdamW, equal tokens" if not r["seed"]
                   else None)
        for r in timed["runs"]:
            b.plot(*zip(*r["curve"]), "--", lw=1, color=color, label=f"{summary['best_time'][name]}, equal time"
                   if not r["seed"] else None)
        starts, bins = half_octaves(curves[name])  # (seeds, bins)
        centers = [(a + b - 1) / 2 for a, b in zip(starts, [*starts[1:], T + 1])]
        c.semilogx(range(1, T + 1), curves[name].mean(0), color=color, alpha=0.25, lw=0.6)
        c.errorbar(centers, bins.mean(0), yerr=(bins.mean(0) - bins.min(0).values, bins.max(0).values - bins.mean(0)),
                   fmt="o-", ms=3, color=color, label=f"{name}: half-octave bins, seed min-max")
    b.axvline(summary["budget_s"], color="gray", ls=":", lw=1)
    c.axhline(summary["unigram"], color="gray", ls="--", lw=1, label="unigram (no context, train split)")
    for (n, (k, loss)), ls in zip(summary["ngram"].items(), ("-.", ":")):
        c.axhline(loss, color="black", ls=ls, lw=1, label=f"{'bigram' if int(n) == 2 else 'trigram'} (add-{k:g})")
    a.set(xlabel="peak learning rate", ylabel="selection loss (val 1st half)", title="lr grids (★ chosen)")
    b.set(xlabel="wall seconds (training + train.py's evals)", ylabel="val loss (train.py's estimate)",
          title=f"chosen lrs, seeds {seeds_range(summary)} (dotted: the time budget)")
    c.set(xlabel="position in the context", ylabel="test loss (nats/token)", title="loss by position, equal tokens")
    for ax in (a, b, c):
        ax.legend(fontsize=7)
    ctx.save(fig, "lm.png", lm_detail(summary))


def lm_detail(summary):
    """The figures' receipt of the lm experiment: corpus, models, budget and protocol."""
    gpt, lstm = summary["gpt"], summary["lstm"]
    seeds = summary["grid_seeds"]
    return (f"corpus {summary['corpus']}; {gpt['desc']} ({gpt['params']:,} params, lr {gpt['lr']:g}) vs {lstm['desc']} "
            f"({lstm['params']:,}, lr {lstm['lr']:g});\ncontext {summary['block_size']}, {summary['steps']} steps x "
            f"{summary['batch_size']} sequences for both, AdamW fp32, warmup + cosine to lr/10; equal time "
            f"{summary['budget_s']:g} s: gpt {summary['best_time']['gpt']}, lstm {summary['best_time']['lstm']};\n"
            f"lr grid with seed{'s 0-' + str(seeds - 1) if seeds > 1 else ' 0'}, chosen on the val split's 1st half, "
            f"then seeds {seeds_range(summary)} at it; losses on the 2nd half; min-max over seeds")


def exp_positions(ctx):
    """RoPE, learned, sinusoidal and no position information in the lm experiment's GPT (its lr, steps and seeds), at
    the trained length and at twice it."""
    summary = lm_results(ctx)
    gpt, T = summary["gpt"], summary["block_size"]
    shutil.rmtree(RUNS / "positions", ignore_errors=True)
    runs = {"rope": gpt["runs"]}
    for pos in SCHEMES[1:]:
        runs[pos] = [fit(ctx, summary, "positions", "gpt", f"pos={pos}", [f"model.pos={pos}"], gpt["lr"], r["seed"])
                     for r in gpt["runs"]]
    test_half, windows = halves(summary["data_dir"])[1], BUDGET[ctx.preset]["test_windows"]
    def long(r):
        return position_losses(final_model(r["out"], 2 * T, ctx.device), test_half, 2 * T,
                                         windows and windows // 2)  # the same tokens in half as many windows
    at_2T = {pos: torch.stack([long(r) for r in runs[pos]]) for pos in SCHEMES if pos != "learned"}
    lstm_2T = torch.stack([long(r) for r in summary["lstm"]["runs"]])
    tested = [pos for pos in SCHEMES if pos in at_2T]
    ctx.row("positions", f"test loss at the trained length {T}: " + " / ".join(SCHEMES),
            " / ".join(spread([r["test"] for r in runs[pos]]) for pos in SCHEMES),
            spread([r["test"] for r in summary["lstm"]["runs"]]),
            f"GPT at the lm experiment's lr {gpt['lr']:g} (tuned with rope) and budget; {seeds_note(summary)}; "
            f"{capped_note(runs)}; LSTM for reference")
    ctx.row("positions", f"test loss at positions {T + 1}-{2 * T}, run at {2 * T}: " + " / ".join(tested),
            " / ".join(spread(c[:, T:].mean(1).tolist()) for c in at_2T.values()),
            spread(lstm_2T[:, T:].mean(1).tolist()),
            f"built with block_size={2 * T} and the trained weights loaded (RoPE and sinusoidal tables are rebuilt, "
            f"not saved); learned positions have no embedding past {T}, so cannot run there; the LSTM's state "
            f"simply carries on")
    positions_figure(ctx, summary, runs, at_2T, lstm_2T)


def positions_figure(ctx, summary, runs, at_2T, lstm_2T):
    T, bin_size = summary["block_size"], max(1, summary["block_size"] // 16)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, pos in enumerate(SCHEMES):
        curve = at_2T[pos] if pos in at_2T else torch.tensor([r["by_position"] for r in runs[pos]])
        a.plot(*binned(curve.mean(0), bin_size), color=f"C{i}", label=pos)
        tests = [[r["test"] for r in runs[pos]]] + ([at_2T[pos][:, T:].mean(1).tolist()] if pos in at_2T else [])
        for j, values in enumerate(tests):
            b.bar(i + 0.4 * j, np.mean(values), 0.4, yerr=[[np.mean(values) - min(values)],
                  [max(values) - np.mean(values)]], color=f"C{i}", alpha=1 - 0.5 * j, capsize=3)
    a.plot(*binned(lstm_2T.mean(0), bin_size), "k--", lw=1, label="LSTM")
    a.axvline(T + 0.5, color="gray", ls=":", lw=1)
    a.set(xlabel="position", ylabel=f"test loss, mean of {bin_size} positions",
          title=f"trained at {T}, run at {2 * T} (right of the dotted line)")
    low = min(min(r["test"] for r in rs) for rs in runs.values())
    b.set(xticks=[i + 0.2 for i in range(len(SCHEMES))], xticklabels=SCHEMES, ylim=(0.95 * low, None),
          ylabel="test loss", title=f"positions 1-{T} (solid), {T + 1}-{2 * T} (pale); seed range")
    a.legend(fontsize=8)
    ctx.save(fig, "positions.png", f"GPT {summary['gpt']['desc']} at lr {summary['gpt']['lr']:g} (the lm "
             f"experiment's, tuned with rope), seeds {', '.join(str(r['seed']) for r in runs['rope'])}; "
             + lm_detail(summary))


def exp_window(ctx):
    """Sliding-window attention (each query sees itself and window - 1 earlier tokens) against the lm experiment's
    full-attention GPT at the same context, lr, steps and seeds: what the window costs."""
    summary = lm_results(ctx)
    gpt, T = summary["gpt"], summary["block_size"]
    shutil.rmtree(RUNS / "window", ignore_errors=True)
    sizes = [w for w in BUDGET[ctx.preset]["windows"] if w < T]
    runs = {0: gpt["runs"]} | {w: [fit(ctx, summary, "window", "gpt", f"window={w}", [f"model.window={w}"],
                                       gpt["lr"], r["seed"]) for r in gpt["runs"]] for w in sizes}
    def label(w):
        return f"window {w}" if w else "full"
    tests = {w: [r["test"] for r in rs] for w, rs in runs.items()}
    ctx.row("window", f"test loss at context {T}: " + " / ".join(map(label, runs)),
            " / ".join(spread(v) for v in tests.values()), spread([r["test"] for r in summary["lstm"]["runs"]]),
            f"{seeds_note(summary)}; {capped_note(runs)}; wall s "
            + " / ".join(spread([r["seconds"] for r in rs], 0) for rs in runs.values()) + "; LSTM for reference")
    ctx.row("window", "loss a window costs against full attention: " + " / ".join(map(label, sizes)),
            " / ".join(spread([a - b for a, b in zip(tests[w], tests[0])]) for w in sizes), "-",
            f"differences within each seed; {gpt['desc']} has {gpt['n_layer']} layers, so a token reaches "
            + " / ".join(str(gpt["n_layer"] * (w - 1)) for w in sizes) + " tokens back")
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (w, rs) in enumerate(runs.items()):
        ax.plot(*binned(torch.tensor([r["by_position"] for r in rs]).mean(0), max(1, T // 16)), color=f"C{i}",
                label=label(w))
        if w:
            ax.axvline(gpt["n_layer"] * (w - 1) + 1, color=f"C{i}", ls=":", lw=1)
    ax.set(xlabel="position in the context", ylabel=f"test loss, mean of {max(1, T // 16)} positions",
           title="sliding-window attention (dotted: the farthest a token reaches through all layers)")
    ax.legend(fontsize=8)
    ctx.save(fig, "window.png", f"GPT {gpt['desc']} at lr {gpt['lr']:g} (tuned with full attention); "
             + lm_detail(summary))


def binned(curve, size):
    """(bin centres, means) of curve over consecutive bins of size positions: readable where one position is noisy."""
    n = len(curve) // size * size
    return torch.arange(n).view(-1, size).float().mean(1) + 1, curve[:n].view(-1, size).mean(1)


def corpus_name(ctx):
    return Path(ctx.data_path).name if ctx.data_path else "stdlib"


def lm_summary():
    """The last lm experiment's settings, choices and runs; {} before one has run."""
    path = RUNS / "lm" / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def lm_results(ctx):
    """lm_summary() for ctx's preset and corpus, running the lm experiment first where its runs are not there."""
    summary = lm_summary()
    if (summary.get("preset"), summary.get("corpus")) != (ctx.preset, corpus_name(ctx)) or not all(
            Path(r["out"], "ckpt.pt").exists() for name in ("gpt", "lstm") for r in summary[name]["runs"]):
        print(f"no lm runs for the {ctx.preset} preset on {corpus_name(ctx)} yet; running the lm experiment first")
        exp_lm(ctx)
        summary = lm_summary()
    return summary


def best_run(name):
    """The run folder of the last lm experiment's model "gpt" or "lstm" at its chosen lr, seed 0."""
    summary = lm_summary()
    if not summary:
        raise FileNotFoundError("no lm experiment has run yet; train its models with: "
                                "python -m scripts.report --only lm")
    return Path(summary[name]["runs"][0]["out"])
