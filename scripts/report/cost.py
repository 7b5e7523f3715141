"""What each model costs: training throughput against length, batch and threads; one layer's time and memory at long
contexts, beside the remedies (fused kernels, a sliding window); decoding time and memory."""
from dataclasses import replace
from functools import partial

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import NullLocator
from tqdm import tqdm

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from attnlab.optim import train_step
from attnlab.runtime import alternate, peak_bytes
from model import CausalSelfAttention, GPTConfig, KVCache
from scripts.report.tasks import lstm_preset, rnn_width, synthetic_models

VOCAB = 96  # the stdlib corpus's characters
WINDOW = 256  # the windowed GPT's window in long and generation: each query sees itself and 255 tokens before it
PROCESSORS = 1024  # the work-span model's processor count
BUDGET = {
    # throughput: a training step at every (batch, length, threads), `repeats` timed rounds after a warm-up each.
    # long: one layer's forward and backward at each length, `long_rounds` rounds; a path stops where growth as T²
    # from its last point predicts more than memory_cap bytes or time_cap_s seconds per call.
    # generation: new_tokens decoded (median per token) after each of the contexts
    "quick": dict(batches=(1, 8, 32), lengths=(64, 256, 1024), threads=(1, 2), repeats=3,
                  long_lengths=(256, 512, 1024, 2048, 4096, 8192), long_rounds=3, memory_cap=2 * 2**30, time_cap_s=10,
                  contexts=(64, 256, 1024, 4096), new_tokens=32),
    "full": dict(batches=(1, 8, 32, 128), lengths=(64, 128, 256, 512, 1024), threads=(1, 2), repeats=5,
                 long_lengths=(256, 512, 1024, 2048, 4096, 8192, 16384), long_rounds=5, memory_cap=8 * 2**30,
                 time_cap_s=60, contexts=(64, 256, 1024, 4096, 16384), new_tokens=64),
}


def throughput_models(block_size):
    """The synthetic tasks' 2 x 64 GPT and the 2-layer LSTM of its size, both with the head tied to the embedding as
    train.py's default GPT has it: the two differ in their layers only."""
    gpt = replace(synthetic_models(VOCAB, block_size)["gpt"], tie_weights=True)
    width = rnn_width(build_model(gpt).num_params(), VOCAB, tied=True)
    return {"gpt": gpt, "lstm": ModelConfig(type="lstm", vocab_size=VOCAB, block_size=block_size, n_layer=2,
                                            n_embd=width, tie_weights=True)}


def length_axis(ax, lengths, label):
    """A log x axis ticked at the lengths measured, in plain numbers."""
    ax.set_xlabel(label)
    ax.set_xticks(lengths, [f"{T:,}" for T in lengths])
    ax.xaxis.set_minor_locator(NullLocator())


def threads_label(n):
    return "this device" if n is None else f"{n} thread{'s' * (n > 1)}"


def measure_throughput(models, optimizers, threads, batches, lengths, repeats, device):
    """{(model, threads, B, T): training tokens/s}, each model's step timed in turn (A B A B) after a warm-up, so a
    busy spell slows both alike; threads None keeps the current count."""
    measured = {}
    for n, B, T in tqdm([(n, B, T) for n in threads for B in batches for T in lengths], desc="throughput", leave=False):
        if n:
            torch.set_num_threads(n)
        x = torch.randint(VOCAB, (B, T + 1), generator=torch.Generator().manual_seed(T)).to(device)
        fns = {name: partial(train_step, models[name], optimizers[name], [(x[:, :-1], x[:, 1:])]) for name in models}
        for fn in fns.values():
            fn()  # warm-up: allocator, kernels
        seconds = alternate(fns, repeats, device)
        measured.update({(name, n, B, T): B * T / seconds[name] for name in models})
    return measured


def cell_latency(width, device):
    """Seconds of one LSTM cell step on one sequence (median of 200): the work-span model's τ."""
    cell = torch.nn.LSTMCell(width, width).to(device)
    with torch.no_grad():
        h = torch.zeros(1, width, device=device)
        return alternate({"cell": lambda: cell(h, (h, h))}, 200, device)["cell"]


def exp_throughput(ctx):
    """Training tokens/s (forward, backward, AdamW step) at equal parameters and equal tokens per step, against the
    sequence length, at several batch sizes, on 1 and 2 CPU threads (a GPU alone); then a work-span model of the
    same on many processors, drawn apart from the measurements."""
    budget = BUDGET[ctx.preset]
    batches, lengths = budget["batches"], budget["lengths"]
    configs = throughput_models(max(lengths))
    torch.manual_seed(0)
    models = {name: build_model(cfg).to(ctx.device) for name, cfg in configs.items()}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    threads = budget["threads"] if ctx.device.type == "cpu" else (None,)  # a GPU has no thread axis
    before = torch.get_num_threads()
    try:
        measured = measure_throughput(models, optimizers, threads, batches, lengths, budget["repeats"], ctx.device)
        torch.set_num_threads(1)  # τ: one small step's latency, which more threads only slow
        tau = cell_latency(configs["lstm"].n_embd, ctx.device)
    finally:
        torch.set_num_threads(before)
    flops = {name: model.flops_per_token for name, model in models.items()}  # training FLOPs per token at length T
    # Work-span (Brent 1974): on P processors a step takes about W / (P f) + S τ, with W the step's FLOPs, f the best
    # FLOP/s per thread measured here, S the dependent steps and τ one LSTM cell's latency. S is 2·n_layer layer steps
    # for the GPT (forward and back, every position at once) and 2·(T + n_layer - 1) cell steps for the LSTM (layer
    # l's step t waits for its own step t - 1 and layer l - 1's step t: a wavefront)
    f = max(flops[name](T) * tokens / (n or 1) for (name, n, B, T), tokens in measured.items())
    span = {"gpt": lambda T: 2 * configs["gpt"].n_layer, "lstm": lambda T: 2 * (T + configs["lstm"].n_layer - 1)}
    def estimate(name, B, T):
        return B * T / (B * T * flops[name](T) / (PROCESSORS * f) + span[name](T) * tau)

    fig, axes = plt.subplots(1, len(batches) + 1, figsize=(3.6 * (len(batches) + 1), 3.8))
    for ax in axes[1:-1]:
        ax.sharey(axes[0])  # the measured panels share a scale; the model's has its own
    for ax, B in zip(axes, batches):
        for name, color in (("gpt", "C0"), ("lstm", "C1")):
            for n in threads:
                ax.loglog(lengths, [measured[name, n, B, T] for T in lengths], "o-" if n == threads[-1] else "o--",
                          color=color, label=f"{name}, {threads_label(n)}")
        length_axis(ax, lengths, "sequence length T")
        ax.set_title(f"measured, batch {B}")
    axes[0].set_ylabel("training tokens / s")
    axes[0].legend(fontsize=7)
    model_ax = axes[-1]
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        for B, style in ((batches[0], ":"), (batches[-1], "-.")):
            model_ax.loglog(lengths, [estimate(name, B, T) for T in lengths], style, color=color, lw=1,
                            label=f"{name}, batch {B}")
    model_ax.set_facecolor("0.94")
    length_axis(model_ax, lengths, "sequence length T")
    model_ax.set_title(f"MODEL, not measured:\nwork-span, {PROCESSORS} processors")
    model_ax.legend(fontsize=7)
    n_gpt, n_lstm = (m.num_params() for m in models.values())
    ctx.save(fig, "throughput.png", f"GPT 2x{configs['gpt'].n_embd} ({n_gpt:,} params) vs LSTM "
             f"2x{configs['lstm'].n_embd} ({n_lstm:,}), heads tied; one AdamW step of B sequences of T tokens, "
             f"median of {budget['repeats']} alternating rounds after a warm-up.\nModel panel: step = W/(P·f) + S·τ, "
             f"P={PROCESSORS}, f={f / 1e9:.1f} GFLOP/s (best per thread here), τ={tau * 1e6:.0f} µs (one LSTM cell)")

    short, long = lengths[0], lengths[-1]
    def kilo(v):
        return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.0f}K"
    ctx.row("throughput", f"training FLOPs per token, T={short} / T={long}",
            f"{kilo(flops['gpt'](short))} / {kilo(flops['gpt'](long))}",
            f"{kilo(flops['lstm'](short))} / {kilo(flops['lstm'](long))}",
            "at equal parameters (6N within 1%) the GPT does more at every T measured, by 12·L·C·T for attention; "
            "attention's n < d advantage over recurrence (Vaswani et al., Table 1) holds per layer only")
    def per(name, B, T):
        return " / ".join(f"{measured[name, n, B, T]:,.0f}" for n in threads)
    def ratio(B, T):
        return " / ".join(f"{measured['lstm', n, B, T] / measured['gpt', n, B, T]:.2f}" for n in threads)
    names = " / ".join(threads_label(n) for n in threads)
    for B, T in ((batches[0], short), (batches[0], long), (batches[-1], short), (batches[-1], long)):
        ctx.row("throughput", f"training tokens/s, batch {B}, T={T}, {names}", per("gpt", B, T), per("lstm", B, T),
                f"LSTM/GPT = {ratio(B, T)}")
    if len(threads) > 1:
        corners = ((batches[0], short), (batches[-1], long))
        def gain(name, B, T):
            return measured[name, threads[-1], B, T] / measured[name, threads[0], B, T]
        def speed_up(name):
            return " / ".join(f"{gain(name, B, T):.2f}x" for B, T in corners)
        ctx.row("throughput", f"speed-up on {threads[-1]} threads over {threads[0]}, batch {corners[0][0]} "
                f"T={short} / batch {corners[1][0]} T={long}", speed_up("gpt"), speed_up("lstm"),
                f"parallel efficiency = speed-up / {threads[-1] // threads[0]}")
    ctx.row("throughput", f"work-span model (not measured), {PROCESSORS} processors, batch {batches[0]}, T={long}, "
            f"tokens/s", f"{estimate('gpt', batches[0], long):,.0f}", f"{estimate('lstm', batches[0], long):,.0f}",
            f"dependent steps: GPT {span['gpt'](long)} vs LSTM {span['lstm'](long):,}; τ={tau * 1e6:.0f} µs")


def forward_backward(layer, x, grad):
    """One layer's forward and backward; the gradients are dropped after, so every call starts from the same memory."""
    layer(x)[0].backward(grad)
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
