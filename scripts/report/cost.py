"""What each model costs: training throughput against length at realistic widths, with a work-span model of the same
on parallel hardware; one layer's time and memory at long contexts, beside the remedies (fused kernels, a sliding
window); decoding time and memory. scripts/report/gpu.py measures the throughput on a GPU."""
import json
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import NullLocator
from tqdm import tqdm

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from attnlab.optim import train_step
from attnlab.runtime import alternate, peak_bytes
from model import GPT, CausalSelfAttention, GPTConfig, KVCache
from scripts.report.mechanism import autograd_depth
from scripts.report.tasks import lstm_preset, rnn_width

VOCAB = 96  # the stdlib corpus's characters
WINDOW = 256  # the windowed GPT's window in long and generation: each query sees itself and 255 tokens before it
PROCESSORS = 1024  # the work-span model's processor count
GPT_LAYERS, HEAD_SIZE = 4, 64  # the throughput GPT at every width: 4 blocks, heads of 64 as in GPT-2
BUDGET = {
    # throughput: a training step of `tokens` tokens (batch tokens / T) at every (width, T), on `threads` threads,
    # `repeats` alternating timed rounds after a warm-up each; the full preset adds d=64, where CPU kernels are
    # overhead-bound, to show the ratio's trend with width. Sized by FLOPs per step (flops_per_token x tokens, both
    # models, every call) over the measured GFLOP/s (docs/report.md has the wall times)
    # long: one layer's forward and backward at each length, `long_rounds` rounds; a path stops where growth as T²
    # from its last point predicts more than memory_cap bytes or time_cap_s seconds per call.
    # generation: new_tokens decoded (median per token) after each of the contexts
    "quick": dict(widths=(256, 512), lengths=(64, 256, 1024), tokens=4096, threads=2, repeats=2,
                  long_lengths=(256, 512, 1024, 2048, 4096, 8192), long_rounds=3, memory_cap=2 * 2**30, time_cap_s=10,
                  contexts=(64, 256, 1024, 4096), new_tokens=32),
    "full": dict(widths=(64, 256, 512), lengths=(64, 256, 1024), tokens=4096, threads=2, repeats=3,
                 long_lengths=(256, 512, 1024, 2048, 4096, 8192, 16384), long_rounds=3, memory_cap=8 * 2**30,
                 time_cap_s=30, contexts=(64, 256, 1024, 4096, 16384), new_tokens=64),
}
REALISTIC = 256  # the narrowest width the verdict reads: below it the CPU's kernels are overhead-bound
GPU_RESULTS = Path("out/report/gpu/results.json")  # python -m scripts.report.gpu's default output, where it has run


def throughput_models(width, block_size):
    """A GPT of GPT_LAYERS blocks of `width` and the 2-layer LSTM of its size (rnn_width), both with the head tied to
    the embedding as train.py's default GPT has it: the two differ in their layers only."""
    gpt = ModelConfig(vocab_size=VOCAB, block_size=block_size, n_layer=GPT_LAYERS, n_head=width // HEAD_SIZE or 1,
                      n_embd=width, tie_weights=True)
    lstm_width = rnn_width(build_model(gpt).num_params(), VOCAB, tied=True)
    return {"gpt": gpt, "lstm": ModelConfig(type="lstm", vocab_size=VOCAB, block_size=block_size, n_layer=2,
                                            n_embd=lstm_width, tie_weights=True)}


def shape(cfg):
    heads = f" ({cfg.n_head} head{'s' * (cfg.n_head > 1)})" if cfg.type == "gpt" else ""
    return f"{cfg.n_layer}x{cfg.n_embd}{heads}"


def length_axis(ax, lengths, label):
    """A log x axis ticked at the lengths measured, in plain numbers."""
    ax.set_xlabel(label)
    ax.set_xticks(lengths, [f"{T:,}" for T in lengths])
    ax.xaxis.set_minor_locator(NullLocator())


def measure_throughput(models, tokens, lengths, repeats, device):
    """{(model, T): (training tokens/s, seconds spent)}: each model's step of `tokens` tokens (tokens // T sequences)
    timed in turn (A B A B) after a warm-up, so a busy spell slows both alike."""
    measured = {}
    for T in lengths:
        B = max(1, tokens // T)
        x = torch.randint(VOCAB, (B, T + 1), generator=torch.Generator().manual_seed(T)).to(device)
        optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
        fns = {name: partial(train_step, m, optimizers[name], [(x[:, :-1], x[:, 1:])]) for name, m in models.items()}
        for fn in fns.values():
            fn()  # warm-up: allocator, kernels
        seconds = alternate(fns, repeats, device)
        measured.update({(name, T): B * T / seconds[name] for name in models})
    return measured


def op_latency(device, chain=100, rounds=20):
    """Seconds of one dependent operation on a tiny tensor (a chain of `chain` in a row, median of rounds): the
    latency no parallelism removes, the work-span model's τ."""
    def run():
        x = torch.ones(8, device=device)
        for _ in range(chain):
            x = x * 1.0
    return alternate({"chain": run}, rounds, device)["chain"] / chain


def block_depth(cfg):
    """Dependent operations in one GPT block, forward (autograd depth of two blocks minus one, so the embedding and
    the loss are not counted), RoPE included."""
    def depth(n_layer):
        model = GPT(replace(cfg.architecture(), n_layer=n_layer, block_size=16))
        x = torch.randint(VOCAB, (1, 16))
        return autograd_depth(model(x, x)[1])
    return depth(2) - depth(1)


def lstm_step_depth(width):
    """Dependent operations in one LSTM cell step, forward (two steps minus one): the fused nn.LSTM hides its steps
    from autograd, the cell loop shows them."""
    cell = torch.nn.LSTMCell(width, width)
    def depth(steps):
        x = torch.randn(steps, 1, width, requires_grad=True)
        h = c = torch.zeros(1, width)
        for t in range(steps):
            h, c = cell(x[t], (h, c))
        return autograd_depth(h.sum())
    return depth(2) - depth(1)


def work_span(flops, span, tokens, T, flops_per_s, tau, processors=PROCESSORS):
    """Tokens/s a step of `tokens` tokens at length T would reach on `processors` processors of flops_per_s each
    (Brent 1974): step = W / (P f) + S τ, W = tokens · flops(T) the step's FLOPs, S = span(T) its dependent ops."""
    return tokens / (tokens * flops(T) / (processors * flops_per_s) + span(T) * tau)


def spans(configs, depths):
    """Dependent ops of one training step (forward and backward: twice the forward's) against T: every GPT block's
    depth, all positions at once; for the LSTM T + n_layer - 1 cell steps (layer l's step t waits for its own step
    t - 1 and for layer l - 1's step t: a wavefront) of its step depth each."""
    gpt, lstm = configs["gpt"].n_layer, configs["lstm"].n_layer
    return {"gpt": lambda T: 2 * gpt * depths["gpt"], "lstm": lambda T: 2 * (T + lstm - 1) * depths["lstm"]}


def throughput_verdict(ratios, model_ratio, where):
    """(evidence, status) of reason (a) from ratios ({(width, T): LSTM/GPT tokens/s measured here} at the realistic
    widths) and the work-span model's LSTM/GPT at `where`. A CPU of two threads is not the parallel hardware the
    reason speaks of: a GPT slower here leaves it not shown, never contradicted."""
    faster = sum(r < 1 for r in ratios.values())
    low, high = min(ratios.values()), max(ratios.values())
    evidence = (f"measured LSTM/GPT training tokens/s at d >= {REALISTIC}: {low:.2f}-{high:.2f} (min-max over "
                f"{len(ratios)} (d, T) points; the GPT faster at {faster}); work-span model (not measured) at {where}: "
                f"LSTM/GPT = {model_ratio:.2f}")
    return evidence, "shown here" if faster == len(ratios) else "not shown here"


def gpu_verdict(results, cpu_evidence):
    """(evidence, status) of reason (a) from a GPU run of scripts/report/gpu.py: parallel hardware, so an LSTM faster
    at every length measured there contradicts the reason, and a GPT faster at every one shows it."""
    rates = {(r["model"], r["T"]): r["tokens_per_s"] for r in results["throughput"]}
    ratios = [rates["lstm", T] / rates["gpt", T] for T in sorted({T for _, T in rates}) if ("gpt", T) in rates
              and ("lstm", T) in rates]
    faster = sum(r < 1 for r in ratios)
    evidence = (f"measured on {results['hardware']} ({results['date']}, python -m scripts.report.gpu): LSTM/GPT "
                f"training tokens/s {min(ratios):.2f}-{max(ratios):.2f} (min-max over {len(ratios)} lengths; the GPT "
                f"faster at {faster}; {results['note']}); on this CPU: {cpu_evidence}")
    if faster == len(ratios):
        return evidence, "shown here"
    return evidence, "contradicted here" if faster == 0 else "not shown here"


@dataclass
class Throughput:
    """What exp_throughput measured: per width d the two models' configs, parameters, FLOPs per token (a function of
    T) and autograd depths; tokens/s per (d, model, T); one dependent op's latency tau and the best FLOP/s per
    thread f, which the work-span model takes."""
    widths: tuple
    lengths: tuple
    tokens: int
    threads: int
    configs: dict
    params: dict
    flops: dict
    depths: dict
    measured: dict
    tau: float
    f: float = 0.0

    def estimate(self, d, name, T):
        """The work-span model's tokens/s for one model at width d and length T."""
        span = spans(self.configs[d], self.depths[d])[name]
        return work_span(self.flops[d][name], span, self.tokens, T, self.f, self.tau)


def exp_throughput(ctx):
    """Training tokens/s (forward, backward, AdamW step) at equal parameters and equal tokens per step against the
    sequence length, at several widths; then a work-span model of the same on many processors, drawn apart."""
    budget = BUDGET[ctx.preset]
    t = measure_widths(ctx, budget)
    throughput_figure(ctx, t, budget["repeats"])
    throughput_rows(ctx, t)
    decide_throughput(ctx, t)


def measure_widths(ctx, budget):
    """tau on one thread, then every width's two models timed on the budget's threads; each point to grid.csv."""
    before = torch.get_num_threads()
    t = Throughput(budget["widths"], budget["lengths"], budget["tokens"],
                   budget["threads"] if ctx.device.type == "cpu" else 1, {}, {}, {}, {}, {}, 0.0)
    try:
        torch.set_num_threads(1)  # τ and the depths: one small op's latency, which more threads only slow
        t.tau = op_latency(ctx.device)
        if ctx.device.type == "cpu":
            torch.set_num_threads(budget["threads"])
        for d in tqdm(t.widths, desc="throughput", leave=False):
            t.configs[d] = throughput_models(d, max(t.lengths))
            t.depths[d] = dict(gpt=block_depth(t.configs[d]["gpt"]),
                               lstm=lstm_step_depth(t.configs[d]["lstm"].n_embd))
            torch.manual_seed(0)
            models = {name: build_model(cfg).to(ctx.device) for name, cfg in t.configs[d].items()}
            t.flops[d] = {name: model.flops_per_token for name, model in models.items()}
            t.params[d] = {name: model.num_params() for name, model in models.items()}
            rates = measure_throughput(models, t.tokens, t.lengths, budget["repeats"], ctx.device)
            for (name, T), rate in rates.items():
                t.measured[d, name, T] = rate
                B = max(1, t.tokens // T)
                ctx.grid_point("throughput", name, f"d={d} ({shape(t.configs[d][name])}) T={T} B={B}", 1e-4, 0,
                               budget["repeats"] + 1, (budget["repeats"] + 1) * B * T / rate, "training tokens/s",
                               round(rate))
    finally:
        torch.set_num_threads(before)
    # f: the best FLOP/s per thread any step reached here
    t.f = max(t.flops[d][name](T) * rate / t.threads for (d, name, T), rate in t.measured.items())
    return t


def threads_text(ctx, t):
    return f"{t.threads} thread{'s' * (t.threads > 1)}" if ctx.device.type == "cpu" else "this device"


def throughput_figure(ctx, t, repeats):
    """One measured panel per width, then the work-span model's panel, grey: a model, not a measurement."""
    fig, axes = plt.subplots(1, len(t.widths) + 1, figsize=(3.6 * (len(t.widths) + 1), 3.8))
    for ax, d in zip(axes, t.widths):
        for name, color in (("gpt", "C0"), ("lstm", "C1")):
            ax.loglog(t.lengths, [t.measured[d, name, T] for T in t.lengths], "o-", color=color,
                      label=f"{name} {shape(t.configs[d][name])}")
        length_axis(ax, t.lengths, "sequence length T")
        ax.set_title(f"measured, d={d}, {t.params[d]['gpt'] / 1e6:.2g}M params")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("training tokens / s")
    model_ax = axes[-1]
    for d, style in zip(t.widths, (":", "--", "-", "-.")):
        for name, color in (("gpt", "C0"), ("lstm", "C1")):
            model_ax.loglog(t.lengths, [t.estimate(d, name, T) for T in t.lengths], style, color=color, lw=1,
                            label=f"{name}, d={d}")
    model_ax.set_facecolor("0.94")
    length_axis(model_ax, t.lengths, "sequence length T")
    model_ax.set_title(f"MODEL, not measured:\nwork-span, {PROCESSORS} processors")
    model_ax.legend(fontsize=6)
    top = t.depths[t.widths[-1]]
    ctx.save(fig, "throughput.png", f"GPT {GPT_LAYERS} blocks of d (heads of {HEAD_SIZE}) vs the 2-layer LSTM of its "
             f"size, heads tied; one AdamW step of {t.tokens:,} tokens (batch {t.tokens:,}/T), fp32, "
             f"{threads_text(ctx, t)}; median of {repeats} alternating rounds after a warm-up.\nModel panel: step = "
             f"W/(P·f) + S·τ, P={PROCESSORS}, f={t.f / 1e9:.1f} GFLOP/s (best per thread here), τ={t.tau * 1e6:.1f} "
             f"µs (one dependent op, measured); S = 2·n_layer·{top['gpt']} (GPT block depth) vs 2·(T+1)·"
             f"{top['lstm']} (LSTM step depth), autograd depths measured")


def kilo(v):
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.0f}K"


def throughput_rows(ctx, t):
    """FLOPs per token at the widest d, tokens/s at every (d, T) with the ratio, and the work-span model's row."""
    d, short, long = t.widths[-1], t.lengths[0], t.lengths[-1]
    gpt, lstm = t.configs[d]["gpt"], t.configs[d]["lstm"]
    ctx.row("throughput", f"training FLOPs per token at d={d}, T={short} / T={long}",
            f"{kilo(t.flops[d]['gpt'](short))} / {kilo(t.flops[d]['gpt'](long))}",
            f"{kilo(t.flops[d]['lstm'](short))} / {kilo(t.flops[d]['lstm'](long))}",
            f"GPT {shape(gpt)} vs LSTM {shape(lstm)}, {t.params[d]['gpt']:,} vs {t.params[d]['lstm']:,} params; 6N "
            f"plus, for the GPT, 12·L·C·T for attention")
    for w in t.widths:
        for T in t.lengths:
            ratio = t.measured[w, "lstm", T] / t.measured[w, "gpt", T]
            ctx.row("throughput", f"training tokens/s, d={w}, T={T} (batch {max(1, t.tokens // T)}), "
                    f"{threads_text(ctx, t)}", f"{t.measured[w, 'gpt', T]:,.0f}", f"{t.measured[w, 'lstm', T]:,.0f}",
                    f"LSTM/GPT = {ratio:.2f}; GPT {shape(t.configs[w]['gpt'])} vs LSTM {shape(t.configs[w]['lstm'])}")
    S = {name: span(long) for name, span in spans(t.configs[d], t.depths[d]).items()}
    ctx.row("throughput", f"work-span model (not measured), d={d}, T={long}, {PROCESSORS} processors, tokens/s",
            f"{t.estimate(d, 'gpt', long):,.0f}", f"{t.estimate(d, 'lstm', long):,.0f}",
            f"a model: step = W/(P·f) + S·τ with S the dependent ops of a step, GPT {S['gpt']:,} (2 x {gpt.n_layer} "
            f"blocks x {t.depths[d]['gpt']} measured) vs LSTM {S['lstm']:,} (2 x (T+1) steps x {t.depths[d]['lstm']} "
            f"measured); τ={t.tau * 1e6:.1f} µs, f={t.f / 1e9:.1f} GFLOP/s measured")


def decide_throughput(ctx, t):
    """Reason (a) from the widths d >= REALISTIC; a real GPU run's results, where present, decide instead."""
    ratios = {(d, T): t.measured[d, "lstm", T] / t.measured[d, "gpt", T] for d in t.widths if d >= REALISTIC
              for T in t.lengths}
    if not ratios:
        return
    d, long = t.widths[-1], t.lengths[-1]
    model_ratio = t.estimate(d, "lstm", long) / t.estimate(d, "gpt", long)
    evidence, status = throughput_verdict(ratios, model_ratio, f"d={d}, T={long}, {PROCESSORS} processors")
    gpu = json.loads(GPU_RESULTS.read_text()) if GPU_RESULTS.exists() else {}
    if gpu.get("smoke") is False and gpu["throughput"]:  # a real GPU run decides; a --smoke one is a code check
        evidence, status = gpu_verdict(gpu, evidence)
    elif status != "shown here":
        evidence += "; needs a GPU: python -m scripts.report.gpu"
    ctx.verdict("throughput", "a", evidence, status)


def forward_backward(layer, x, grad):
    """One layer's forward and backward; the gradients are dropped after, so every call starts from the same memory."""
    y = layer(x)
    if isinstance(layer, torch.nn.LSTM):
        y = y[0]  # (output, state)
    y.backward(grad)
    layer.zero_grad(set_to_none=True)
    x.grad = None


def grows_past(values, T, cap):
    """Whether values ({length: measure}) would pass cap at length T, growing as T² from their last point."""
    last = max(values, default=None)
    return last is not None and values[last] * (T / last) ** 2 > cap


def exp_long(ctx):
    """Time and peak memory of one layer's forward and backward against the context length, at batch 1: attention
    with its T x T weights written out, fused attention (never holds them), a sliding window (O(T·W)), and an LSTM
    layer of the same width."""
    budget, width, n_head = BUDGET[ctx.preset], 256, 4
    lengths = budget["long_lengths"]
    base = GPTConfig(n_embd=width, n_head=n_head, block_size=max(lengths))
    torch.manual_seed(0)
    layers = {"manual": CausalSelfAttention(replace(base, attn="manual"), 0), "sdpa": CausalSelfAttention(base, 0),
              "window": CausalSelfAttention(replace(base, window=WINDOW), 0),
              "lstm": torch.nn.LSTM(width, width, batch_first=True)}
    layers = {name: layer.to(ctx.device) for name, layer in layers.items()}
    seconds, memory, skipped = {name: {} for name in layers}, {name: {} for name in layers}, {}
    caps = ((memory, budget["memory_cap"], f"peak over {budget['memory_cap'] / 2**30:g} GiB"),
            (seconds, budget["time_cap_s"], f"over {budget['time_cap_s']} s per call"))
    for T in tqdm(lengths, desc="long", leave=False):
        for name in set(layers) - set(skipped):
            why = next((why for values, cap, why in caps if grows_past(values[name], T, cap)), None)
            if why:
                skipped[name] = (T, why)
        x = torch.randn(1, T, width, device=ctx.device, requires_grad=True)
        grad = torch.randn(1, T, width, device=ctx.device)
        fns = {name: partial(forward_backward, layer, x, grad) for name, layer in layers.items() if name not in skipped}
        for fn in fns.values():
            fn()  # warm-up
        for name, s in alternate(fns, budget["long_rounds"], ctx.device).items():
            seconds[name][T], memory[name][T] = s, peak_bytes(fns[name], ctx.device)

    labels = {"manual": "attention, T x T materialised (manual)", "sdpa": "attention, fused (SDPA)",
              "window": f"attention, sliding window {WINDOW} (SDPA by chunks)", "lstm": "LSTM layer"}
    fig, (a, b) = plt.subplots(1, 2, figsize=(10.5, 4))
    for i, (name, label) in enumerate(labels.items()):
        if name in skipped:
            label += f"\n(skipped from T={skipped[name][0]}: predicted {skipped[name][1]})"
        for ax, values, scale in ((a, seconds, 1e3), (b, memory, 2**-20)):
            ax.loglog(list(values[name]), [v * scale for v in values[name].values()], "o-", color=f"C{i}", label=label)
    a.set(ylabel="ms per forward + backward", title="time of one layer, batch 1")
    b.set(ylabel="peak MiB", title="peak memory of one layer, batch 1")
    for ax in (a, b):
        length_axis(ax, lengths, "context length T")
    b.legend(fontsize=7)
    peak_how = "the allocator's peak" if ctx.device.type == "cuda" else "the profiler's allocation events"
    ctx.save(fig, "long.png", f"one CausalSelfAttention layer ({n_head} heads x {width // n_head}: projections, "
             f"QK-norm, no RoPE) vs torch.nn.LSTM({width}, {width}); fp32, batch 1; median of {budget['long_rounds']} "
             f"alternating rounds;\npeak memory beyond the inputs, from {peak_how}; a path stops where T² growth from "
             f"its last point passes {budget['memory_cap'] / 2**30:g} GiB or {budget['time_cap_s']} s")

    T = lengths[-1]
    attention = ("manual", "sdpa", "window")
    def entry(values, name, fmt):
        return fmt(values[name][T]) if T in values[name] else "skipped"
    notes = [f"{name} skipped from T={at} (predicted {why}); at T={max(seconds[name])}: "
             f"{seconds[name][max(seconds[name])] * 1e3:,.0f} ms, {memory[name][max(memory[name])] / 2**20:,.0f} MiB"
             for name, (at, why) in skipped.items() if seconds[name]]
    for measure, values, fmt in (("ms", seconds, lambda v: f"{v * 1e3:,.1f}"),
                                 ("peak MiB", memory, lambda v: f"{v / 2**20:,.1f}")):
        ctx.row("long", f"one layer forward+backward at T={T}, {measure}: manual / fused SDPA / window {WINDOW}",
                " / ".join(entry(values, name, fmt) for name in attention), entry(values, "lstm", fmt),
                "; ".join(notes) or f"batch 1, width {width}")


def exp_generation(ctx):
    """Per-token decoding time and memory against the context already read: a KV cache grows, a sliding window's
    cache stops growing at the window, an LSTM's state never grows."""
    budget, warmup = BUDGET[ctx.preset], 4
    contexts, new_tokens = budget["contexts"], budget["new_tokens"]
    # a longer block_size adds RoPE table rows, not parameters
    gpt_cfg = ModelConfig(vocab_size=VOCAB, block_size=max(contexts) + warmup + new_tokens)
    configs = {"gpt": gpt_cfg, "window": replace(gpt_cfg, window=WINDOW), "lstm": lstm_preset(VOCAB)}
    torch.manual_seed(0)
    models = {name: build_model(cfg).to(ctx.device).eval() for name, cfg in configs.items()}
    latency, memory = {n: [] for n in models}, {n: [] for n in models}
    for k, T in enumerate(tqdm(contexts[:1] + contexts, desc="generation", leave=False)):  # the first pass warms up
        prompt = torch.randint(VOCAB, (1, T), generator=torch.Generator().manual_seed(T)).to(ctx.device)
        caches = {name: model.new_cache(1, ctx.device, torch.float32) for name, model in models.items()}
        with torch.no_grad():
            logits = {n: model(prompt, cache=caches[n], last_logits_only=True)[0] for n, model in models.items()}
            tokens = {name: logits[name][:, -1].argmax(-1, keepdim=True) for name in models}

            def decode(name):
                logits[name] = models[name](tokens[name], cache=caches[name], last_logits_only=True)[0]
                tokens[name] = logits[name][:, -1].argmax(-1, keepdim=True)

            fns = {name: partial(decode, name) for name in models}
            alternate(fns, warmup, ctx.device)
            seconds = alternate(fns, new_tokens, ctx.device)  # interleaved, so a busy machine slows all alike
        if k == 0:
            continue
        for name in models:
            latency[name].append(seconds[name])
            # a GPT's cache holding exactly T tokens (the window's last WINDOW at most); the LSTM's state as it is
            held = KVCache(configs[name], 1, T, "cpu", torch.float32) if name != "lstm" else caches[name]
            memory[name].append(held.nbytes)
        for name in ("gpt", "window"):
            arch = configs[name]
            formula = 2 * arch.n_layer * arch.kv_heads * arch.head_size * min(T, arch.window or T) * 4  # K, V, fp32
            if memory[name][-1] != formula:
                raise AssertionError(f"{name} KV cache holds {memory[name][-1]} bytes at T={T}, formula {formula}")
    labels = {"gpt": "gpt (KV cache)", "window": f"gpt, window {WINDOW} (KV cache)", "lstm": "lstm (state)"}
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (name, label), color in zip(labels.items(), ("C0", "C2", "C1")):
        a.loglog(contexts, [1e3 * t for t in latency[name]], "o-", color=color, label=label)
        b.loglog(contexts, memory[name], "o-", color=color, label=label)
    a.set(ylabel="ms per generated token", title="decoding latency")
    b.set(ylabel="bytes per sequence", title="memory carried between tokens")
    for ax in (a, b):
        length_axis(ax, contexts, "context already read (tokens)")
        ax.legend(fontsize=8)
    n_gpt, n_lstm = models["gpt"].num_params(), models["lstm"].num_params()
    ctx.save(fig, "generation.png", f"GPT {n_gpt:,} (also with a {WINDOW}-token window) vs LSTM {n_lstm:,} "
             f"parameters, batch 1, float32; median of {new_tokens} decoded tokens after each context, alternating;\n"
             f"KV bytes = 2·n_layer·n_kv_head·head_size·min(T, window)·4, checked")
    def both(values, i, fmt):
        return f"{fmt(values['gpt'][i])}; window {WINDOW}: {fmt(values['window'][i])}"
    def ms(v):
        return f"{1e3 * v:.2f}"
    for i in (0, len(contexts) - 1):
        ctx.row("generation", f"ms per generated token after {contexts[i]} tokens", both(latency, i, ms),
                ms(latency["lstm"][i]))
    ctx.row("generation", f"bytes carried per sequence after {contexts[-1]} tokens",
            both(memory, -1, lambda v: f"{v:,}"), f"{memory['lstm'][-1]:,}",
            "KV cache = 2·n_layer·n_kv_head·head_size·min(T, window)·4 bytes: the window's stops growing at the "
            "window, the state never grows")
