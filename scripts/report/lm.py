"""Language-model runs and the lm experiment. Every run is `python train.py` on one corpus at one context, its final
weights scored on the val split: the 1st half chooses (the selection loss), the 2nd half is every reported number
(the test loss). sizes.py and context.py train and read their runs through this file too.

    lm   the GPT against the LSTM of its parameter count, each at its best recipe (protocol.best_recipe), at equal
         tokens and at equal wall time: far below the data-rich regime, so its rows decide nothing (sizes.py decides
         reason (b)'s loss part); equal wall time on this CPU is what a user gets per second, not evidence for (b)
    python -m scripts.report --only lm
"""
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from attnlab.checkpoint import build_model, load_model
from attnlab.config import compose
from attnlab.record import read_metrics
from data.corpus import load_meta, load_split, prepare
from scripts.report import RUNS
from scripts.report.protocol import Recipe, Tuned, best_recipe, mean_range
from scripts.report.tasks import matched_width

ROOT = Path(__file__).resolve().parents[2]  # the repository root, where train.py runs
RESULT = RUNS / "lm" / "result.json"  # the last lm training's LMResult
PLATEAU_NATS = 0.01  # a run whose val loss fell by more than this over its last quarter was still improving at the end
UNLEARNT = 0.1  # nats: a run this close to the unigram's loss learnt nothing
ADD_K = (1e-3, 1e-2, 0.1, 1.0)  # the n-gram baselines' add-k smoothing, chosen on the selection half like an lr
MAX_ITERS_PER_CAP = 50  # a time-budget run's step cap, in step caps: far enough that the seconds end it
NAMES = ("gpt", "lstm")


@dataclass(frozen=True)
class Budget:
    """What the lm experiment may spend. Runs: 2 models x 2 optimizers x (3 grid points + 2 seeds) at equal tokens,
    2 x 3 at equal time; 8 x 256 tokens a step is train.py's default 16 x 128."""
    gpt: tuple = ("model.n_layer=2", "model.n_head=2", "model.n_embd=64")  # the GPT as train.py overrides
    block_size: int = 256  # every run's context
    batch_size: int = 8  # sequences a step
    steps: int = 128  # the step cap at equal tokens
    adamw_lrs: tuple = (("gpt", (1.5e-3, 3e-3, 6e-3)), ("lstm", (5e-3, 1e-2, 2e-2)))  # each model's AdamW lr grid
    muon_lrs: tuple = (("gpt", (0.02, 0.04, 0.08)), ("lstm", (0.08, 0.16, 0.32)))  # and Muon muon_lr grid
    seeds: int = 3  # seeds of the chosen recipe (grid points: seed 0)
    evals: int = 4  # train.py's val estimates per step cap (the curves)
    eval_iters: int = 4  # batches per estimate
    select_windows: int | None = 128  # windows of block_size scored on the val split's 1st half (None: all)
    test_windows: int | None = 512  # and on its 2nd half


QUICK = Budget()
BUDGET = dict(quick=QUICK, full=replace(QUICK, gpt=("model.n_layer=3", "model.n_head=3", "model.n_embd=96"), steps=256,
                                        select_windows=256, test_windows=None))


@dataclass
class Plan:
    """What every run of one experiment shares: the prepared corpus, the context, the step cap and the scoring."""
    data_dir: str
    block_size: int  # T, the context of every run
    batch_size: int  # sequences a step
    steps: int  # the step cap at equal tokens (a time-budget run's cap is MAX_ITERS_PER_CAP times it)
    evals: int  # train.py's val estimates per step cap (the curves)
    eval_iters: int  # batches per estimate
    select_windows: int | None  # windows of block_size scored on the val split's 1st half (None: all)
    test_windows: int | None  # and on its 2nd half

    @classmethod
    def of(cls, data_dir, budget, **changes):
        """The plan of a budget (lm's, or sizes' with its steps given)."""
        names = [f.name for f in fields(cls) if f.name != "data_dir"]
        return cls(str(data_dir), **{name: changes.get(name, getattr(budget, name, None)) for name in names})

    @property
    def tokens(self):
        """Training tokens of a run to the step cap."""
        return self.steps * self.batch_size * self.block_size


@dataclass
class LMModel:
    name: str  # gpt | lstm
    overrides: list  # train.py's overrides for its shape, context and corpus
    desc: str  # e.g. "2x64 GPT, 2 heads"
    n_layer: int
    params: int


@dataclass
class LMRun:
    """One train.py run scored on its final weights."""
    out: str  # the run folder (config.json, metrics, ckpt.pt)
    recipe: Recipe
    seed: int
    iters: int  # steps taken
    seconds: float  # wall seconds of training and train.py's evaluations
    curve: list  # [(seconds, train.py's val loss estimate)]
    select: float  # mean loss on the val split's 1st half: what tuning reads
    test: float  # mean loss on its 2nd half: what the rows report
    by_position: list  # the test loss at each position 1..T
    improving: bool  # still improving at the end (PLATEAU_NATS)


@dataclass
class LMResult:
    """One pair's training: both models tuned at equal tokens (tuned[name]: the best recipe's Tuned, the other
    optimizer's in its others), the equal-time runs at those recipes (timed[name], lm only) and the n-gram baselines
    ({n: (add-k, test loss)})."""
    preset: str
    corpus: str
    vocab: int
    unigram: float  # nats per token of the train split's token frequencies: a model that ignores the context
    plan: Plan
    models: dict  # name -> LMModel
    tuned: dict = field(default_factory=dict)  # name -> Tuned at equal tokens
    budget_s: float = 0.0  # train.time_budget_s of every equal-time run
    timed: dict = field(default_factory=dict)  # name -> [LMRun] at equal time
    ngram: dict = field(default_factory=dict)  # n -> (add-k, test loss)

    def runs(self, name):
        """name's equal-token runs at its best recipe, by seed."""
        return self.tuned[name].by_seed

    def optimizer(self, name, optimizer):
        """name's Tuned on one optimizer's grid (adamw | muon) at equal tokens."""
        return next(t for t in [self.tuned[name], *self.tuned[name].others] if t.recipe.optimizer == optimizer)

    @classmethod
    def from_dict(cls, d):
        def run(r):
            return LMRun(**{**r, "recipe": Recipe(**r["recipe"]), "curve": [tuple(p) for p in r["curve"]]})
        def tuned(t):
            return Tuned(Recipe(**t["recipe"]), [(Recipe(**r), m) for r, m in t["tried"]], t["edge"],
                         {int(s): run(r) for s, r in t["runs"].items()}, t["flat"], [tuned(o) for o in t["others"]])
        return cls(d["preset"], d["corpus"], d["vocab"], d["unigram"], Plan(**d["plan"]),
                   {n: LMModel(**m) for n, m in d["models"].items()}, {n: tuned(t) for n, t in d["tuned"].items()},
                   d["budget_s"], {n: [run(r) for r in rs] for n, rs in d["timed"].items()},
                   {int(n): tuple(v) for n, v in d["ngram"].items()})


def save_results(path, results):
    """[LMResult] as JSON, for the experiments that read them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(r) for r in results], indent=1))


def cached_results(path, ctx):
    """The [LMResult] saved at path where they are ctx's preset and corpus and every run's checkpoint is there, else
    None."""
    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    results = [LMResult.from_dict(d) for d in (saved if isinstance(saved, list) else [saved])]  # a dict: one result
    if (results[0].preset, results[0].corpus) != (ctx.preset, corpus_name(ctx)) or not all(
            Path(run.out, "ckpt.pt").exists() for r in results for n in NAMES
            for run in [*r.runs(n), *r.timed.get(n, [])]):
        return None
    return results


def cached_lm(ctx):
    """The lm training's LMResult for ctx's preset and corpus where all its runs are there, else None."""
    results = cached_results(RESULT, ctx)
    return results and results[0]


def lm_results(ctx):
    """The LMResult for ctx's preset and corpus, training it first (train_lm) where its runs are not there."""
    result = cached_lm(ctx)
    if result is None:
        print(f"no lm runs for the {ctx.preset} preset on {corpus_name(ctx)} yet; training them first")
        result = train_lm(ctx)
    return result


def best_run(ctx, name):
    """The run folder of the lm training's model "gpt" or "lstm" at its best recipe, seed 0 (trained first where it
    is not there)."""
    return Path(lm_results(ctx).runs(name)[0].out)


def train_lm(ctx):
    """Both models tuned at equal tokens, trained at equal time with their recipes, the n-gram baselines: the
    LMResult, saved to RESULT."""
    shutil.rmtree(RUNS / "lm", ignore_errors=True)  # scripts/report owns these runs; train.py never overwrites
    budget = BUDGET[ctx.preset]
    data_dir, vocab, models = pair_models(ctx, budget.gpt, budget.block_size)
    result = LMResult(ctx.preset, corpus_name(ctx), vocab, unigram_entropy(data_dir), Plan.of(data_dir, budget),
                      models)
    plan, seeds = result.plan, list(range(budget.seeds))
    for name, model in result.models.items():
        def fit(recipe, seed, model=model):
            return lm_run(ctx, plan, "lm", model, f"context={plan.block_size}", recipe, seed)
        result.tuned[name] = best_recipe(fit, dict(budget.adamw_lrs)[name], dict(budget.muon_lrs)[name], seeds,
                                         selection_merit)
        print(f"lm: {name} at equal tokens: {result.tuned[name].recipe} chosen")
    # at least 0.1 s: a budget rounded to 0 would mean no budget (runs shorter than that are tiny test models)
    result.budget_s = max(0.1, round(statistics.mean(r.seconds for r in result.runs("gpt")), 1))
    for name, model in result.models.items():
        result.timed[name] = [lm_run(ctx, plan, "lm", model, f"context={plan.block_size} time={result.budget_s:g}s",
                                     result.tuned[name].recipe, seed, seconds=result.budget_s) for seed in seeds]
    result.ngram = ngram_baselines(plan.data_dir, result.vocab)
    save_results(RESULT, [result])
    return result


def selection_merit(runs):
    """Higher is better: the runs' mean selection loss, negated."""
    return -statistics.mean(r.select for r in runs)


def pair_models(ctx, gpt_overrides, block_size):
    """The corpus prepared at block_size (once, before the runs, which then find it prepared), its vocabulary, and
    {name: LMModel}: the GPT of gpt_overrides and configs/model/lstm.yaml at the width of the GPT's parameter count on
    this corpus's vocabulary (tasks.matched_width)."""
    data = ["data=text", f"data.path={ctx.data_path}"] if ctx.data_path else []
    shape = [f"model.block_size={block_size}"]
    gpt = compose(*gpt_overrides, *shape, *data)
    data_dir = prepare(gpt.data, block_size)
    vocab = load_meta(data_dir)["vocab_size"]
    gpt_model = replace(gpt.model, vocab_size=vocab)
    lstm = replace(compose("model=lstm", *shape).model, vocab_size=vocab)
    lstm = replace(lstm, n_embd=matched_width(lstm, build_model(gpt_model).num_params()))
    models = {}
    for name, cfg, overrides in (("gpt", gpt_model, list(gpt_overrides)),
                                 ("lstm", lstm, ["model=lstm", f"model.n_embd={lstm.n_embd}"])):
        desc = f"{cfg.n_layer}x{cfg.n_embd} " + (f"GPT, {cfg.n_head} heads" if name == "gpt" else "LSTM")
        models[name] = LMModel(name, [*overrides, *shape, *data], desc, cfg.n_layer, build_model(cfg).num_params())
    return data_dir, vocab, models


def lm_run(ctx, plan, experiment, model, setting, recipe, seed, seconds=0.0):
    """model trained by train.py with recipe, then scored on its final weights: the selection loss, and the test loss
    at each position. Both go to the grid table (lr: the recipe's grid lr); returns the LMRun. seconds > 0 trains for
    that time budget (train.time_budget_s) instead of to the step cap, the lr decaying over it."""
    muon = [f"train.muon_lr={recipe.muon_lr}"] if recipe.optimizer == "muon" else []
    slug = f"{setting}-{recipe.optimizer}-lr{recipe.lr:g}" + (f"-muonlr{recipe.muon_lr:g}" if muon else "")
    out = RUNS / experiment / f"{model.name}-{slug.replace('=', '').replace(' ', '-')}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    # fp32 for both (auto would take bf16 where it is native); evaluations every cap/evals steps in both protocols
    timed = [f"train.time_budget_s={seconds}", f"train.max_iters={MAX_ITERS_PER_CAP * plan.steps}"] if seconds else [
        f"train.max_iters={plan.steps}"]
    run_train_py([*model.overrides, f"train.batch_size={plan.batch_size}", f"train.device={ctx.device}",
                  "train.dtype=float32", f"train.optimizer={recipe.optimizer}", f"train.learning_rate={recipe.lr}",
                  f"train.min_lr={recipe.lr / 10}", *muon, *timed, f"train.warmup_iters={plan.steps // 10}",
                  f"train.eval_interval={max(1, plan.steps // plan.evals)}", f"train.eval_iters={plan.eval_iters}",
                  f"train.seed={seed}", f"logger.log_interval={max(1, plan.steps // 20)}", f"out_dir={out}"])
    evals = read_metrics(out, "eval")
    select_half, test_half = halves(plan.data_dir)
    scored = load_model(out, "latest", ctx.device)[0]
    select = position_losses(scored, select_half, plan.block_size, plan.select_windows).mean().item()
    test = position_losses(scored, test_half, plan.block_size, plan.test_windows)
    earlier = [r for r in evals if r["iter"] <= 0.75 * evals[-1]["iter"]][-1]  # the start of the last quarter
    run = LMRun(str(out), recipe, seed, evals[-1]["iter"], evals[-1]["elapsed_s"],
                [(r["elapsed_s"], r["val_loss"]) for r in evals], select, test.mean().item(),
                [round(v, 4) for v in test.tolist()], earlier["val_loss"] - evals[-1]["val_loss"] > PLATEAU_NATS)
    grid_setting = f"{setting} {recipe.optimizer}" + (f" adamw_lr={recipe.lr:g}" if muon else "")
    for metric, value in (("selection loss", run.select), ("test loss", run.test)):
        ctx.grid_point(experiment, model.name, grid_setting, recipe.grid_lr, seed, run.iters, run.seconds, metric,
                       round(value, 4))
    return run


def run_train_py(overrides):
    """`python train.py OVERRIDES` from this working directory (relative paths mean what they mean here), on this
    process's torch threads; its progress and errors print as they come."""
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    if subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], env=env).returncode:
        sys.exit(f"report: `python train.py {' '.join(overrides)}` failed; its error is above")


def corpus_name(ctx):
    return Path(ctx.data_path).name if ctx.data_path else "stdlib"


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
    """(bin starts 1, 2, 3, 4, 6, 8, 11, 16, ... (2^(k/2) rounded), curves (..., T) averaged over each bin)."""
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
    """(the seeds' mean loss change from bin early to bin late, the larger of the two bins' seed ranges: the spread it
    must exceed to count); curves (seeds, T), bins (first, last) inclusive."""
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
    the loss change from positions 65-128 to 129-T against the seed spread."""
    if T < 256:
        return f"a context of {T} is too short to test Kaplan et al. 2020's ~100-token finding"
    changes = {name: change(c, (65, 128), (129, T)) for name, c in curves.items()}
    gpt, lstm = (-changes[name][0] > changes[name][1] for name in ("gpt", "lstm"))  # falls beyond the spread
    reading = {(True, False): "as Kaplan et al. 2020 (fig. 7) found: the GPT still gains past position 128, the LSTM "
                              "does not",
               (True, True): "unlike Kaplan et al. 2020 (fig. 7), the LSTM too still gains past position 128",
               (False, True): "the opposite of Kaplan et al. 2020 (fig. 7): the LSTM gains past position 128, the GPT "
                              "does not",
               (False, False): "neither model gains past position 128 above the seed spread, so Kaplan et al. "
                               "2020's (fig. 7) contrast cannot show at this scale"}[gpt, lstm]
    numbers = "; ".join(f"{n} {delta:+.3f} (seed spread {noise:.3f})" for n, (delta, noise) in changes.items())
    return f"{reading}; {numbers}; a gain counts when the loss falls by more than the seed spread"


def test_losses(runs):
    return [r.test for r in runs]


def seeds_range(result):
    seeds = sorted(result.tuned["gpt"].runs)
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])


def seeds_note(result):
    return f"mean [min, max] over seeds {seeds_range(result)}"


def ngram_note(ngram):
    return ", ".join(f"{'bigram' if int(n) == 2 else 'trigram'} {loss:.3f} (add-{k:g})"
                     for n, (k, loss) in ngram.items())


def lm_detail(result):
    """The figures' receipt of the lm training."""
    gpt, lstm, plan = result.models["gpt"], result.models["lstm"], result.plan
    return (f"corpus {result.corpus}; {gpt.desc} ({gpt.params:,} params) vs {lstm.desc} ({lstm.params:,}); context "
            f"{plan.block_size}, {plan.steps} steps x {plan.batch_size} sequences for both, fp32, warmup + cosine to "
            f"lr/10;\neach model's best recipe at equal tokens: gpt {result.tuned['gpt'].recipe}, lstm "
            f"{result.tuned['lstm'].recipe}; equal time {result.budget_s:g} s of training at those recipes;\n"
            f"chosen on the val split's 1st half (grid seed 0), then seeds {seeds_range(result)}; losses on the 2nd "
            f"half; min-max over seeds")


# ----- the lm experiment -----

def exp_lm(ctx):
    """The GPT against the LSTM of the same size, each at its best recipe, at equal tokens and equal time."""
    result = train_lm(ctx)
    curves = {name: torch.tensor([r.by_position for r in result.runs(name)]) for name in NAMES}
    lm_rows(ctx, result, curves)
    lm_figure(ctx, result, curves)


def lm_rows(ctx, result, curves):
    """The results table's lm rows; curves: each model's test loss by position at equal tokens, (seeds, T)."""
    gpt, lstm, plan = result.models["gpt"], result.models["lstm"], result.plan
    T, best = plan.block_size, {n: result.runs(n) for n in NAMES}
    adamw = {n: result.optimizer(n, "adamw").by_seed for n in NAMES}
    ctx.row("lm", "models", f"{gpt.desc}, {gpt.params:,} params", f"{lstm.desc}, {lstm.params:,} params",
            f"corpus {result.corpus} ({result.vocab} tokens; unigram {result.unigram:.2f} nats); context {T}; "
            f"{plan.batch_size} sequences a step; fp32")
    per_param = plan.tokens / max(gpt.params, lstm.params)
    ctx.row("lm", f"test loss at equal tokens ({plan.tokens / 1e6:.2f}M, {per_param:.2g} tokens per parameter: "
            f"under-trained, decides nothing), each model's best recipe, final weights",
            *(mean_range(test_losses(best[n])) for n in NAMES),
            f"{plan.steps} steps; {recipes_note(result)}; {seeds_note(result)}; {improving_note(best)}; "
            f"{ngram_note(result.ngram)}")
    stuck = {n: sum(r.test > result.unigram - UNLEARNT for r in adamw[n]) for n in NAMES}
    ctx.row("lm", f"test loss at equal tokens ({plan.tokens / 1e6:.2f}M), AdamW for both (an extra row, decides "
            f"nothing)", *(mean_range(test_losses(adamw[n])) for n in NAMES),
            "; ".join(grid_note(result.optimizer(n, "adamw"), n) for n in NAMES) + f"; within {UNLEARNT} nats of the "
            "unigram: " + ", ".join(f"{n} {stuck[n]} of {len(adamw[n])}" for n in NAMES)
            + f"; {improving_note(adamw)}")
    ctx.row("lm", f"test loss at equal wall time ({result.budget_s:g} s of training on this CPU: what a user gets per "
            f"second, reason (a)'s hardware question, not evidence for (b)), each model's best recipe",
            *(mean_range(test_losses(result.timed[n])) for n in NAMES),
            f"train.time_budget_s={result.budget_s:g}; gpt {result.tuned['gpt'].recipe}, lstm "
            f"{result.tuned['lstm'].recipe}; {seeds_note(result)}; {improving_note(result.timed)}")
    ctx.row("lm", f"tokens seen in {result.budget_s:g} s (M)", *(
        mean_range([r.iters * plan.batch_size * T / 1e6 for r in result.timed[n]], 2) for n in NAMES),
            f"{ctx.hardware}, one run at a time")
    ctx.row("lm", "wall seconds to the step cap at equal tokens (training and train.py's evaluations)",
            *(mean_range([r.seconds for r in best[n]], 0) for n in NAMES), f"{ctx.hardware}, one run at a time")
    bins = position_bins(T)
    def at(c):
        return " / ".join(mean_range(v, 3) for v in bin_means(c, bins).T.tolist())  # c: (seeds, T)
    ctx.row("lm", "test loss at positions " + " / ".join(f"{a}-{b}" for a, b in bins), at(curves["gpt"]),
            at(curves["lstm"]), f"{seeds_note(result)}; " + "; ".join(f"{name}: {position_note(curves[name], bins)}"
                                                                     for name in curves))
    ctx.row("lm", f"loss change from positions 65-128 to 129-{T}" if T >= 256 else "loss change past position 128",
            *(f"{change(curves[name], (65, 128), (129, T))[0]:+.3f}" if T >= 256 else "-" for name in curves),
            kaplan_note(curves, T))


def grid_note(tuned, name):
    """The chosen grid point among those tried ((edge): at an end after widening), and its mean selection loss."""
    key = "muon_lr" if tuned.recipe.optimizer == "muon" else "lr"
    tried = ", ".join(f"{recipe.grid_lr:g}" for recipe, _ in tuned.tried)
    return (f"{name} {tuned.recipe.optimizer} {key} {tuned.recipe.grid_lr:g} of [{tried}]" + " (edge)" * tuned.edge
            + f", selection {-selection_merit(list(tuned.runs.values())):.3f}")


def recipes_note(result):
    return "; ".join(f"{grid_note(result.optimizer(n, 'adamw'), n)}; {grid_note(result.optimizer(n, 'muon'), n)}; "
                     f"{n} chose {result.tuned[n].recipe}" for n in NAMES)


def improving_note(runs):
    return "still improving at the end: " + ", ".join(f"{n} {sum(r.improving for r in rs)} of {len(rs)}"
                                                      for n, rs in runs.items())


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
        starts, bins = half_octaves(curves[name])  # (seeds, bins)
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
          title=f"best recipes, seeds {seeds_range(result)} (dotted: the time budget)")
    c.set(xlabel="position in the context", ylabel="test loss (nats/token)", title="loss by position, equal tokens")
    for ax in (a, b, c):
        ax.legend(fontsize=7)
    ctx.save(fig, "lm.png", lm_detail(result))
