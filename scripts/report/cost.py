"""What each model costs beyond training: one layer's time and memory at long contexts, beside the remedies (fused
kernels, a sliding window); decoding time and memory. scripts/report/parallel.py measures training throughput."""
import statistics
from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
import torch

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from model import CausalSelfAttention, GPTConfig, KVCache
from scripts.report.tasks import VOCAB, length_axis, lstm_preset
from scripts.timing import layer_costs, token_times

WINDOW = 256  # the windowed GPT's window in long and generation: each query sees itself and 255 tokens before it


@dataclass(frozen=True)
class Budget:
    """long: one layer's forward and backward at each length, long_rounds rounds; a path stops where growth as T²
    from its last point predicts more than memory_cap bytes or time_cap_s seconds a call. generation: new_tokens
    decoded (median per token) after each of the contexts."""
    long_lengths: tuple = (256, 512, 1024, 2048, 4096, 8192)
    long_rounds: int = 3
    memory_cap: int = 2 * 2**30
    time_cap_s: float = 10
    contexts: tuple = (64, 256, 1024, 4096)
    new_tokens: int = 32


QUICK = Budget()
BUDGET = dict(quick=QUICK, full=replace(QUICK, long_lengths=(*QUICK.long_lengths, 16384), memory_cap=8 * 2**30,
                                        time_cap_s=30, contexts=(*QUICK.contexts, 16384), new_tokens=64))


def exp_long(ctx):
    """Time and peak memory of one layer's forward and backward against the context length, at batch 1: attention
    with its T x T weights written out, fused attention (never holds them), a sliding window (O(T·W)), and an LSTM
    layer of the same width."""
    budget, width, n_head = BUDGET[ctx.preset], 256, 4
    lengths = budget.long_lengths
    base = GPTConfig(n_embd=width, n_head=n_head, block_size=max(lengths))
    torch.manual_seed(0)
    layers = {"manual": CausalSelfAttention(replace(base, attn="manual"), 0), "sdpa": CausalSelfAttention(base, 0),
              "window": CausalSelfAttention(replace(base, window=WINDOW), 0),
              "lstm": torch.nn.LSTM(width, width, batch_first=True)}
    layers = {name: layer.to(ctx.device) for name, layer in layers.items()}
    seconds, memory, skipped = layer_costs(layers, lengths, width, budget.long_rounds, ctx.device,
                                           budget.memory_cap, budget.time_cap_s)

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
             f"QK-norm, no RoPE) vs torch.nn.LSTM({width}, {width}); fp32, batch 1; median of {budget.long_rounds} "
             f"alternating rounds;\npeak memory beyond the inputs, from {peak_how}; a path stops where T² growth from "
             f"its last point passes {budget.memory_cap / 2**30:g} GiB or {budget.time_cap_s} s")

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


@torch.no_grad()
def lstm_state(model, prompt):
    """The recurrent state after reading prompt, which decoding carries from token to token."""
    cache = model.new_cache(1, prompt.device, torch.float32)
    model(prompt, cache=cache, last_logits_only=True)
    return cache


def exp_generation(ctx):
    """Per-token decoding time and memory against the context already read: a KV cache grows, a sliding window's
    cache stops growing at the window, an LSTM's state never grows."""
    budget, warmup, rounds = BUDGET[ctx.preset], 4, 2
    contexts, new_tokens = budget.contexts, budget.new_tokens
    # a longer block_size adds RoPE table rows, not parameters
    gpt_cfg = ModelConfig(vocab_size=VOCAB, block_size=max(contexts) + warmup + new_tokens)
    configs = {"gpt": gpt_cfg, "window": replace(gpt_cfg, window=WINDOW), "lstm": lstm_preset(VOCAB)}
    torch.manual_seed(0)
    models = {name: build_model(cfg).to(ctx.device).eval() for name, cfg in configs.items()}
    latency, memory = {n: [] for n in models}, {n: [] for n in models}
    for k, T in enumerate(contexts[:1] + contexts):  # the first pass warms up
        prompt = torch.randint(VOCAB, (1, T), generator=torch.Generator().manual_seed(T)).to(ctx.device)
        times = {name: [] for name in models}
        for _ in range(rounds):  # in turns, so a busy machine slows every model alike
            for name, model in models.items():
                times[name] += token_times(model, prompt, warmup + new_tokens, True, ctx.device)[1 + warmup:]
        if k == 0:
            continue
        for name in models:
            latency[name].append(statistics.median(times[name]))
            # a GPT's cache holding exactly T tokens (the window's last WINDOW at most); the LSTM's state after T
            gpt = name != "lstm"
            held = KVCache(configs[name], 1, T, "cpu", torch.float32) if gpt else lstm_state(models[name], prompt)
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
             f"parameters, batch 1, float32; median of {rounds} x {new_tokens} decoded tokens after each context, the "
             f"models in turns;\n"
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
