"""Reason (a) where a CPU can show it: training FLOP/s and the 2-thread speedup against the batch at a fixed number
of tokens per step, a GPT with a fixed attention window against the LSTM and the minGRU of equal FLOPs per token;
and the minGRU's parallel scan against its own step-by-step loop. `python -m scripts.report --only parallel`.

At a fixed number of tokens per step the batch falls as T grows (64 sequences of 64 tokens ... 1 of 4,096). A GPT
computes every position at once, so its matmuls keep their (B·T, C) shape whatever the batch; an LSTM's step t waits
for step t - 1, so at batch 1 each of its T steps multiplies one (1, C) row by its recurrent matrix. The window keeps
the GPT's FLOPs per token constant in T, so FLOP/s compares the same work at every batch.
"""
import json
import statistics
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import NullLocator

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from attnlab.optim import train_step
from scripts.report.tasks import VOCAB, length_axis, matched_width
from scripts.timing import time_steps

HEAD_SIZE = 64  # the GPT's heads, as in GPT-2
RNN_LAYERS = {"lstm": 2, "mingru": 4}  # the report's LSTM elsewhere; minGRU's preset (configs/model/mingru.yaml)
THREADS = (1, 2)
STEPS = "mingru steps"  # the minGRU reading its sequences step by step (RNN.scan = False), same model and weights


@dataclass(frozen=True)
class Budget:
    """The GPT: n_layer blocks of width (heads of HEAD_SIZE), each query seeing `window` tokens; one training step of
    `tokens` tokens (batch tokens / T) at each length, every (model, T, threads) once per round, `rounds` rounds after
    a warm-up step each; the minGRU also step by step at step_lengths."""
    width: int = 128
    n_layer: int = 2
    window: int = 64
    lengths: tuple = (64, 512, 4096)
    step_lengths: tuple = (64, 512, 4096)
    tokens: int = 4096
    rounds: int = 10


QUICK = Budget()
BUDGET = dict(quick=QUICK, full=replace(QUICK, width=256, lengths=(64, 256, 1024, 4096),
                                        step_lengths=(64, 256, 1024, 4096)))
KEEPS, FALLS = 0.75, 0.5  # at batch 1: the share of its largest batch's FLOP/s the GPT keeps, the LSTM falls below
RULE = (f"at a fixed number of tokens per step, per round: kept = a model's training FLOP/s at batch 1 over its "
        f"FLOP/s at the largest batch (1 thread); gap = at batch 1, the GPT's 2-thread speedup (1-thread over "
        f"2-thread seconds) minus the LSTM's. Shown here if the GPT's kept has lower quartile >= {KEEPS}, the LSTM's "
        f"kept has upper quartile < {FALLS} and the gap's lower quartile is > 0; contradicted here if the LSTM's kept "
        f"has lower quartile above the GPT's upper quartile and the gap's upper quartile is < 0; else not shown here "
        f"(quartiles over the rounds)")
GPU_RULE = ("on a GPU (scripts/report/gpu.py, full attention at equal parameters): shown here if the GPT's training "
            "tokens/s beats the LSTM's at every length measured, contradicted here if the LSTM's beats at every one, "
            "else not shown here")
GPU_RESULTS = Path("out/report/gpu/results.json")  # python -m scripts.report.gpu's default output, where it has run


def parallel_models(budget):
    """The windowed GPT, then the LSTM and the minGRU whose training FLOPs per token match it (at T >= window, where
    the GPT's stop growing), all with the head tied to the embedding."""
    gpt = ModelConfig(vocab_size=VOCAB, block_size=max(budget.lengths), n_layer=budget.n_layer,
                      n_head=max(1, budget.width // HEAD_SIZE), n_embd=budget.width, window=budget.window,
                      tie_weights=True)
    with torch.device("meta"):
        target = build_model(gpt).flops_per_token(budget.window)
    configs = {"gpt": gpt}
    for name, n_layer in RNN_LAYERS.items():
        rnn = ModelConfig(type=name, vocab_size=VOCAB, block_size=gpt.block_size, n_layer=n_layer, tie_weights=True)
        configs[name] = replace(rnn, n_embd=matched_width(rnn, target, lambda model: model.flops_per_token()))
    return configs


def shape(cfg):
    return f"{cfg.n_layer}x{cfg.n_embd}" + (f", window {cfg.window}" if cfg.type == "gpt" else "")


def quartiles(values):
    """(lower quartile, median, upper quartile) of per-round values."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, median, high


def median_quartiles(values):
    """'median [lower quartile-upper quartile]'."""
    low, median, high = quartiles(values)
    return f"{median:.2f} [{low:.2f}-{high:.2f}]"


def decide(kept, gap):
    """RULE's status from per-round numbers: kept {model: FLOP/s at batch 1 over at the largest batch}, gap the GPT's
    2-thread speedup minus the LSTM's at batch 1."""
    gpt, lstm, gap = quartiles(kept["gpt"]), quartiles(kept["lstm"]), quartiles(gap)
    if gpt[0] >= KEEPS and lstm[2] < FALLS and gap[0] > 0:
        return "shown here"
    if lstm[0] > gpt[2] and gap[2] < 0:
        return "contradicted here"
    return "not shown here"


@dataclass
class Parallel:
    """What exp_parallel measured: each model's config, parameters and training FLOPs per token (the same at every
    length), and seconds per step of every (model, T, threads), one per round; STEPS is the minGRU step by step."""
    configs: dict
    params: dict
    flops: dict
    lengths: tuple
    tokens: int
    seconds: dict

    def batch(self, T):
        return self.tokens // T

    @property
    def step_lengths(self):
        """The lengths at which the minGRU was also timed step by step."""
        return tuple(T for T in self.lengths if (STEPS, T, 1) in self.seconds)

    def rates(self, name, T, threads):
        """Training FLOP/s, per round."""
        return [self.flops[name] * self.tokens / s for s in self.seconds[name, T, threads]]

    def kept(self, name):
        """FLOP/s at batch 1 (the longest T) over FLOP/s at the largest batch (the shortest T), 1 thread, per round."""
        short, long = self.seconds[name, self.lengths[0], 1], self.seconds[name, self.lengths[-1], 1]
        return [at_short / at_long for at_short, at_long in zip(short, long)]

    def speedup(self, name, T):
        """1-thread over 2-thread seconds, per round."""
        return [one / two for one, two in zip(self.seconds[name, T, 1], self.seconds[name, T, 2])]

    def gap(self):
        """The GPT's 2-thread speedup minus the LSTM's at batch 1, per round."""
        long = self.lengths[-1]
        return [gpt - lstm for gpt, lstm in zip(self.speedup("gpt", long), self.speedup("lstm", long))]

    def steps_over_scan(self, T):
        """The minGRU's seconds step by step over its seconds with the scan, 1 thread, per round."""
        return [s / p for s, p in zip(self.seconds[STEPS, T, 1], self.seconds["mingru", T, 1])]


def exp_parallel(ctx):
    """Training FLOP/s and the 2-thread speedup against the batch at equal FLOPs per token, on the CPU, and the
    minGRU's scan against its steps; the verdict on reason (a) by RULE, and by GPU_RULE where a GPU run exists."""
    budget = BUDGET[ctx.preset]
    if budget.lengths[-1] != budget.tokens:
        raise ValueError(f"the longest length {budget.lengths[-1]} must be the tokens per step {budget.tokens}, "
                         "so that the last batch is 1, as RULE reads it")
    p = measure(ctx, budget)
    parallel_figure(ctx, p, budget.rounds)
    parallel_rows(ctx, p)
    decide_parallel(ctx, p)


def measure(ctx, budget):
    """Every (model, T, threads) step, and the minGRU's steps at 1 thread, in one alternation: a round times each
    once, so each per-round ratio compares steps taken side by side. On the CPU, whatever ctx.device is: threads are
    what this part varies."""
    torch.manual_seed(0)
    configs = parallel_models(budget)
    models = {name: build_model(cfg) for name, cfg in configs.items()}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in models.items()}

    def step(name, batch, threads):
        torch.set_num_threads(threads)
        train_step(models[name], optimizers[name], [batch])

    def one_by_one(batch):
        models["mingru"].scan = False
        try:
            step("mingru", batch, 1)
        finally:
            models["mingru"].scan = True

    steps = {}
    for T in budget.lengths:
        x = torch.randint(VOCAB, (budget.tokens // T, T + 1), generator=torch.Generator().manual_seed(T))
        batch = (x[:, :-1], x[:, 1:])
        for threads in THREADS:
            steps |= {(name, T, threads): partial(step, name, batch, threads) for name in models}
        if T in budget.step_lengths:
            steps[STEPS, T, 1] = partial(one_by_one, batch)
    before = torch.get_num_threads()
    try:
        seconds = time_steps(steps, budget.rounds, torch.device("cpu"))
    finally:
        torch.set_num_threads(before)
    p = Parallel(configs, {name: model.num_params() for name, model in models.items()},
                 {name: model.flops_per_token(budget.window) for name, model in models.items()},
                 tuple(budget.lengths), budget.tokens, seconds)
    p.flops[STEPS] = p.flops["mingru"]
    for (name, T, threads), times in seconds.items():
        ctx.grid_point("parallel", name, f"{shape(configs[name.split()[0]])} T={T} B={p.batch(T)} threads={threads}",
                       1e-4, 0, budget.rounds + 2, sum(times), "training GFLOP/s",
                       round(statistics.median(p.rates(name, T, threads)) / 1e9, 2))
    return p


COLORS = {"gpt": "C0", "lstm": "C1", "mingru": "C2", STEPS: "C3"}


def batch_axis(ax, p):
    """A log x axis of the batches measured, the largest first."""
    batches = [p.batch(T) for T in p.lengths]
    ax.set_xscale("log")
    ax.set_xticks(batches, [f"{B}" for B in batches])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(f"batch (length T = {p.tokens:,} / batch)")
    ax.invert_xaxis()


def parallel_figure(ctx, p, rounds):
    """GFLOP/s and the 2-thread speedup against the batch (medians, quartile bars), then the minGRU's step-by-step
    time over its scan's against T."""
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    fig.subplots_adjust(wspace=0.3)
    batches = [p.batch(T) for T in p.lengths]
    for name in ("gpt", "lstm", "mingru"):
        label = f"{name} {shape(p.configs[name])}"
        for threads, style in zip(THREADS, ("o-", "s--")):
            q = [quartiles(p.rates(name, T, threads)) for T in p.lengths]
            a.errorbar(batches, [m / 1e9 for _, m, _ in q], [[(m - lo) / 1e9 for lo, m, _ in q],
                                                             [(hi - m) / 1e9 for _, m, hi in q]],
                       fmt=style, color=COLORS[name], label=f"{label}, {threads} thread{'s' * (threads > 1)}")
        q = [quartiles(p.speedup(name, T)) for T in p.lengths]
        b.errorbar(batches, [m for _, m, _ in q], [[m - lo for lo, m, _ in q], [hi - m for _, m, hi in q]], fmt="o-",
                   color=COLORS[name], label=label)
    a.set(ylabel="training GFLOP/s", title="FLOP/s at equal FLOPs per token")
    b.axhline(1, color="0.6", lw=0.8)
    b.set(ylabel="1-thread / 2-thread seconds", title="2-thread speedup")
    q = [quartiles(p.steps_over_scan(T)) for T in p.step_lengths]
    c.errorbar(p.step_lengths, [m for _, m, _ in q], [[m - lo for lo, m, _ in q], [hi - m for _, m, hi in q]], fmt="o-",
               color=COLORS[STEPS])
    c.set_xscale("log")
    c.axhline(1, color="0.6", lw=0.8)
    c.set(ylabel="seconds step by step / with the scan", title=f"minGRU {shape(p.configs['mingru'])}: T steps vs "
          "scan")
    length_axis(c, p.step_lengths, f"sequence length T (batch {p.tokens:,}/T), 1 thread")
    for ax in (a, b):
        batch_axis(ax, p)
    a.legend(fontsize=6)
    b.legend(fontsize=6)
    flops = ", ".join(f"{name} {p.flops[name] / 1e6:.2f}M" for name in ("gpt", "lstm", "mingru"))
    ctx.save(fig, "parallel.png", f"one AdamW training step of {p.tokens:,} tokens on the CPU, fp32, at 1 and 2 "
             f"threads; training FLOPs per token {flops} (widths matched); median and quartiles of {rounds} rounds, "
             f"every point once a round, after a warm-up step each")


def parallel_rows(ctx, p):
    """FLOPs per token; GFLOP/s at 1 / 2 threads and the speedup at every batch; the share kept at batch 1; the
    minGRU's steps over its scan at every T."""
    names = ("gpt", "lstm", "mingru")
    ctx.row("parallel", f"training FLOPs per token (T >= window {p.configs['gpt'].window})",
            *(f"{p.flops[name] / 1e6:.2f}M" for name in ("gpt", "lstm")),
            "; ".join(f"{name} {shape(p.configs[name])}, {p.params[name]:,} params" for name in names)
            + "; 6N, plus 12·L·C·window for the GPT's attention", mingru=f"{p.flops['mingru'] / 1e6:.2f}M")
    for T in p.lengths:
        def cell(name):
            one, two = (statistics.median(p.rates(name, T, threads)) / 1e9 for threads in THREADS)
            return f"{one:.1f} / {two:.1f} (x{median_quartiles(p.speedup(name, T))})"
        ctx.row("parallel", f"training GFLOP/s at 1 / 2 threads (2-thread speedup), T={T:,}, batch {p.batch(T)}",
                cell("gpt"), cell("lstm"), "speedup: median [quartiles] over rounds", mingru=cell("mingru"))
    ctx.row("parallel", f"FLOP/s kept at batch 1 against batch {p.batch(p.lengths[0])}, 1 thread",
            median_quartiles(p.kept("gpt")), median_quartiles(p.kept("lstm")), "median [quartiles] over rounds",
            mingru=median_quartiles(p.kept("mingru")))
    for T in p.step_lengths:
        scan, steps = (statistics.median(p.seconds[name, T, 1]) * 1e3 for name in ("mingru", STEPS))
        ctx.row("parallel", f"minGRU training step, step by step over the scan, T={T:,}, batch {p.batch(T)}", "", "",
                f"{steps:,.0f} vs {scan:,.0f} ms; 1 thread; median [quartiles] over rounds",
                mingru=f"x{median_quartiles(p.steps_over_scan(T))}")


def decide_parallel(ctx, p):
    """RULE on the CPU's numbers; a real GPU run's results, where present, add their own verdict by GPU_RULE."""
    kept = {name: p.kept(name) for name in ("gpt", "lstm", "mingru")}
    long = p.lengths[-1]
    speedups = {name: p.speedup(name, long) for name in kept}
    q = {name: median_quartiles(values) for name, values in kept.items()}
    s = {name: median_quartiles(values) for name, values in speedups.items()}
    evidence = (f"FLOP/s kept at batch 1 against batch {p.batch(p.lengths[0])} (1 thread): GPT {q['gpt']}, LSTM "
                f"{q['lstm']}, minGRU {q['mingru']}; 2-thread speedup at batch 1: GPT {s['gpt']}, LSTM {s['lstm']}, "
                f"minGRU {s['mingru']}; gap GPT - LSTM {median_quartiles(p.gap())} (median [quartiles] over "
                f"{len(p.gap())} rounds, equal FLOPs per token)")
    ctx.verdict("parallel", "a", evidence, decide(kept, p.gap()), rule=RULE)
    gpu = json.loads(GPU_RESULTS.read_text()) if GPU_RESULTS.exists() else {}
    if gpu.get("smoke") is False and gpu["throughput"]:  # a real GPU run; a --smoke one is a code check
        ctx.verdict("parallel", "a", *gpu_verdict(gpu), rule=GPU_RULE)


def gpu_verdict(results):
    """(evidence, status) by GPU_RULE from a GPU run of scripts/report/gpu.py."""
    rates = {(r["model"], r["T"]): r["tokens_per_s"] for r in results["throughput"]}
    ratios = [rates["lstm", T] / rates["gpt", T] for T in sorted({T for _, T in rates}) if ("gpt", T) in rates
              and ("lstm", T) in rates]
    faster = sum(r < 1 for r in ratios)
    evidence = (f"measured on {results['hardware']} ({results['date']}, python -m scripts.report.gpu): LSTM/GPT "
                f"training tokens/s {min(ratios):.2f}-{max(ratios):.2f} (min-max over {len(ratios)} lengths; the GPT "
                f"faster at {faster}; {results['note']})")
    if faster == len(ratios):
        return evidence, "shown here"
    return evidence, "contradicted here" if faster == 0 else "not shown here"
