"""What each model costs: training throughput against the sequence length, and decoding time and memory."""
import time

import matplotlib.pyplot as plt
import torch

from checkpoint import build_model
from config import ModelConfig
from model import KVCache
from rnn import RNNState
from runtime import sync
from training import train_step

from report.tasks import lstm_preset

BUDGET = {"quick": dict(throughput_tokens=4096, repeats=3), "full": dict(throughput_tokens=16384, repeats=5)}


def exp_throughput(ctx):
    """Training tokens/s (forward, backward, AdamW step) at equal parameters and equal tokens per step, against the
    sequence length; then a work-span estimate of the same on many processors."""
    configs = {"gpt": ModelConfig(vocab_size=96, block_size=1024), "lstm": lstm_preset(96)}
    torch.manual_seed(0)
    models = {name: build_model(cfg).to(ctx.device) for name, cfg in configs.items()}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    lengths, tokens = (64, 128, 256, 512, 1024), BUDGET[ctx.preset]["throughput_tokens"]

    def step(name, x):
        train_step(models[name], optimizers[name], [(x[:, :-1], x[:, 1:])])

    measured = {name: [] for name in models}
    for T in lengths:
        x = torch.randint(96, (max(1, tokens // T), T + 1), generator=torch.Generator().manual_seed(T)).to(ctx.device)
        samples = {name: [] for name in models}
        for name in models:
            step(name, x)  # warm-up: allocator, kernels
        for r in range(BUDGET[ctx.preset]["repeats"]):
            for name in (list(models) if r % 2 == 0 else list(models)[::-1]):  # alternate, so load hits both
                sync(ctx.device)
                t0 = time.perf_counter()
                step(name, x)
                sync(ctx.device)
                samples[name].append(x.size(0) * T / (time.perf_counter() - t0))
        for name in models:
            measured[name].append(sorted(samples[name])[len(samples[name]) // 2])
        print(f"throughput T={T}: gpt {measured['gpt'][-1]:,.0f} tok/s, lstm {measured['lstm'][-1]:,.0f} tok/s")
    # work-span (Brent 1974): on P processors a step takes about W / (P f) + S τ. W counts training FLOPs (3x the
    # forward), S the dependent layer steps (GPT: n_layer forward and back; LSTM: n_layer x T each way), f this
    # machine's FLOP/s per thread, τ the latency of one small dependent step (an LSTM cell on one sequence).
    C, H, V = configs["gpt"].n_embd, configs["lstm"].n_embd, 96
    flops = {"gpt": lambda T: 3 * configs["gpt"].n_layer * (24 * T * C * C + 4 * T * T * C) + 3 * 2 * T * C * V,
             "lstm": lambda T: 3 * configs["lstm"].n_layer * 16 * T * H * H + 3 * 2 * T * H * V}
    span = {"gpt": lambda T: 2 * configs["gpt"].n_layer, "lstm": lambda T: 2 * configs["lstm"].n_layer * T}
    threads = 1 if ctx.device.type == "cuda" else torch.get_num_threads()
    f = max(flops[n](T) * measured[n][i] / T / threads for n in models for i, T in enumerate(lengths))
    cell, h = torch.nn.LSTMCell(H, H), torch.zeros(1, H)
    with torch.no_grad():
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            cell(h, (h, h))
            times.append(time.perf_counter() - t0)
    tau = sorted(times)[100]
    P = 1024
    batch = [max(1, tokens // T) for T in lengths]  # the measured steps' sequences, processed side by side
    estimate = {n: [B * T / (B * flops[n](T) / (P * f) + span[n](T) * tau) for B, T in zip(batch, lengths)]
                for n in models}
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for n, color in (("gpt", "C0"), ("lstm", "C1")):
        ax.loglog(lengths, measured[n], "o-", color=color, label=f"{n}: measured here")
        ax.loglog(lengths, estimate[n], "s--", color=color, label=f"{n}: work-span estimate, {P} processors")
    ax.set(xlabel="sequence length T", ylabel="training tokens / s",
           title="training throughput at equal parameters")
    ax.legend(fontsize=8)
    n_gpt, n_lstm = models["gpt"].num_params(), models["lstm"].num_params()
    ctx.save(fig, "throughput.png", f"GPT {n_gpt:,} vs LSTM {n_lstm:,} parameters; {tokens} tokens per step, median "
             f"of {BUDGET[ctx.preset]['repeats']}; estimate: f={f / 1e9:.1f} GFLOP/s per processor, τ={tau * 1e6:.0f} µs")
    for i in (0, len(lengths) - 1):
        T = lengths[i]
        ctx.row("throughput", f"training tokens/s measured here, T={T}", f"{measured['gpt'][i]:,.0f}",
                f"{measured['lstm'][i]:,.0f}", f"LSTM/GPT = {measured['lstm'][i] / measured['gpt'][i]:.2f}")
    ctx.row("throughput", f"work-span estimate, {P} processors, T=1024 (tokens/s)", f"{estimate['gpt'][-1]:,.0f}",
            f"{estimate['lstm'][-1]:,.0f}", f"span: GPT {span['gpt'](1024)} vs LSTM {span['lstm'](1024):,} steps")



def exp_generation(ctx):
    """Per-token decoding time and memory against the context already read: a KV cache grows, a state does not."""
    contexts, new_tokens, warmup = (64, 256, 1024, 4096), 32, 4
    # a longer block_size adds RoPE table rows, not parameters
    gpt_cfg, lstm_cfg = ModelConfig(vocab_size=96, block_size=4096 + warmup + new_tokens), lstm_preset(96)
    torch.manual_seed(0)
    models = {name: build_model(cfg).to(ctx.device).eval() for name, cfg in (("gpt", gpt_cfg), ("lstm", lstm_cfg))}
    latency, memory = {n: [] for n in models}, {n: [] for n in models}
    for k, T in enumerate(contexts[:1] + contexts):  # the first pass only warms up caches and kernels
        prompt = torch.randint(96, (1, T), generator=torch.Generator().manual_seed(T)).to(ctx.device)
        caches = {"gpt": KVCache(gpt_cfg, 1, T + warmup + new_tokens, ctx.device, torch.float32), "lstm": RNNState()}
        with torch.no_grad():
            logits = {n: model(prompt, cache=caches[n], last_logits_only=True)[0] for n, model in models.items()}
            times = {name: [] for name in models}
            for i in range(-warmup, new_tokens):  # interleaved, so a busy machine slows both alike
                for name in (list(models) if i % 2 == 0 else list(models)[::-1]):
                    token = logits[name][:, -1].argmax(-1, keepdim=True)
                    sync(ctx.device)
                    t0 = time.perf_counter()
                    logits[name] = models[name](token, cache=caches[name], last_logits_only=True)[0]
                    sync(ctx.device)
                    if i >= 0:
                        times[name].append(time.perf_counter() - t0)
        if k == 0:
            continue
        for name in models:
            latency[name].append(sorted(times[name])[new_tokens // 2])
        memory["gpt"].append(KVCache(gpt_cfg, 1, T, "cpu", torch.float32).nbytes)  # a cache of exactly T tokens
        memory["lstm"].append(caches["lstm"].nbytes)
        formula = 2 * gpt_cfg.n_layer * gpt_cfg.kv_heads * gpt_cfg.head_size * T * 4  # K and V, float32
        if memory["gpt"][-1] != formula:
            raise AssertionError(f"KV cache holds {memory['gpt'][-1]} bytes at T={T}, formula says {formula}")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        a.loglog(contexts, [1e3 * t for t in latency[name]], "o-", color=color, label=name)
        what = "state" if name == "lstm" else "KV cache"
        b.loglog(contexts, memory[name], "o-", color=color, label=f"{name} ({what})")
    a.set(xlabel="context already read (tokens)", ylabel="ms per generated token", title="decoding latency")
    b.set(xlabel="context already read (tokens)", ylabel="bytes per sequence", title="memory carried between tokens")
    for ax in (a, b):
        ax.legend(fontsize=8)
    n_gpt, n_lstm = (m.num_params() for m in models.values())
    ctx.save(fig, "generation.png", f"GPT {n_gpt:,} vs LSTM {n_lstm:,} parameters, batch 1, float32; median of "
             f"{new_tokens} decoded tokens after each context; KV bytes = 2·n_layer·n_kv_head·head_size·T·4, "
             f"checked")
    for i in (0, len(contexts) - 1):
        ctx.row("generation", f"ms per generated token after {contexts[i]} tokens", f"{1e3 * latency['gpt'][i]:.2f}",
                f"{1e3 * latency['lstm'][i]:.2f}")
    ctx.row("generation", "bytes carried per sequence after 4096 tokens", f"{memory['gpt'][-1]:,}",
            f"{memory['lstm'][-1]:,}", "KV cache = 2·n_layer·n_kv_head·head_size·T·4 bytes; the state is constant")

