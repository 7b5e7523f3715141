"""Why attention replaced RNNs, measured on this machine: a GPT against an LSTM of the same size, in one command.

    python compare.py                    # quick preset (~10-15 min on 2 CPU cores): reports/attention_vs_rnn/
    python compare.py --full             # the stated budgets: lr grids, 1000/1500 recall steps, longer LM runs
    python compare.py --only recall      # one experiment: scaling paths throughput recall induction generation lm
    python compare.py --only lm --data-path tinyshakespeare.txt  # a real corpus of your own

Each run rewrites its experiments' rows of results.csv (rows of experiments not run are kept), then results.md,
the table to read first, and one PNG per figure. Seeds are fixed; figures name model sizes, steps and hardware.
docs/attention.md walks through the mechanism behind each figure.
"""
import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import matplotlib
import torch
import torch.nn.functional as F

from checkpoint import build_model, load_model
from config import ModelConfig, TrainConfig, compose
from data.corpus import load_meta, load_split, prepare
from model import GPT, KVCache
from rnn import RNNState
from runlog import read_metrics
from runtime import hardware_name, pick_device, sync
from training import get_lr, make_optimizer, set_lr, train_step

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

EXPERIMENTS = ("scaling", "paths", "throughput", "recall", "induction", "generation", "lm")
PRESETS = {  # what each experiment may spend; the quick one trades lr points and steps for time (stated in results)
    "quick": dict(recall_lrs={"gpt": [3e-3], "lstm": [1e-2]}, recall_steps={"gpt": 1000, "lstm": 600},
                  induction_steps={"gpt": 1000, "lstm": 600}, lm_seconds=60, throughput_tokens=4096, repeats=3),
    "full": dict(recall_lrs={"gpt": [1e-3, 3e-3], "lstm": [1e-3, 3e-3, 1e-2]}, recall_steps={"gpt": 1000, "lstm": 1500},
                 induction_steps={"gpt": 1500, "lstm": 1500}, lm_seconds=300, throughput_tokens=16384, repeats=5),
}
RESULT_FIELDS = ["experiment", "measure", "gpt", "lstm", "note"]
ROOT = Path(__file__).resolve().parent
LM_RUNS = Path("out/compare")  # experiment 6's training runs (git-ignored); the gradient paths reuse them
LM_MODELS = {"gpt": [], "lstm": ["model=lstm"]}  # experiment 6's models as train.py overrides: the default GPT and
# configs/model/lstm.yaml, which has the same parameter count


@dataclass
class Context:
    preset: str
    budget: dict
    device: torch.device
    out: Path
    data_path: str | None
    hardware: str = ""
    rows: list = field(default_factory=list)

    def row(self, experiment, measure, gpt, lstm, note=""):
        self.rows.append(dict(experiment=experiment, measure=measure, gpt=gpt, lstm=lstm, note=note))

    def save(self, fig, name, detail):
        """Every figure carries its models, budget and hardware, so a PNG read alone is still a receipt."""
        fig.text(0.01, -0.02, f"{detail}\n{self.hardware}; python compare.py ({self.preset})", fontsize=7,
                 color="dimgray", va="top")
        fig.savefig(self.out / name, dpi=100, bbox_inches="tight")
        plt.close(fig)


def lstm_preset(vocab_size):
    """configs/model/lstm.yaml, the LSTM that matches the default GPT's parameter count."""
    return replace(compose("model=lstm").model, vocab_size=vocab_size)


def rnn_width(target, vocab_size, n_layer=2, gates=4, tied=False):
    """The LSTM (gates=4) or GRU (3) width whose parameter count is closest to target; each layer has
    gates x (W_ih, W_hh, b_ih, b_hh)."""
    count = lambda h: vocab_size * h * (1 if tied else 2) + n_layer * gates * (2 * h * h + 2 * h)
    return min(range(4, 2048), key=lambda h: abs(count(h) - target))


def synthetic_models(vocab_size, seq_len):
    """A 2-layer GPT and the 2-layer LSTM of the same size for the synthetic tasks. One head per layer and an
    untied head: in our runs the 4-head and tied variants sat on the chance plateau for over 1000 steps."""
    gpt = ModelConfig(vocab_size=vocab_size, block_size=seq_len, n_layer=2, n_head=1, n_embd=64, tie_weights=False)
    width = rnn_width(build_model(gpt).num_params(), vocab_size)
    lstm = ModelConfig(type="lstm", vocab_size=vocab_size, block_size=seq_len, n_layer=2, n_embd=width,
                       tie_weights=False)
    return {"gpt": gpt, "lstm": lstm}


# ---------------------------------------------------------------- synthetic tasks ----------------------------------

def recall_batch(batch_size, n_pairs, n_keys=16, seq_len=64, generator=None):
    """Multi-query associative recall (Zoology; Arora et al. 2023): n_pairs key-value pairs, then every key once
    more in random order, then filler. The target at each query is its key's value; -1 elsewhere. Tokens: 0 filler,
    1..n_keys keys, n_keys+1..2*n_keys values. Queries follow the pairs, as Zoology's power-law placement mostly
    puts them; returns inputs and targets, each (B, seq_len)."""
    if not 0 < n_pairs <= n_keys or 3 * n_pairs > seq_len:
        raise ValueError(f"{n_pairs} pairs need n_keys >= {n_pairs} and seq_len >= {3 * n_pairs}")
    draw = lambda: torch.rand(batch_size, n_keys, generator=generator).argsort(1)[:, :n_pairs] + 1  # distinct
    keys, values = draw(), draw() + n_keys
    x = torch.zeros(batch_size, seq_len, dtype=torch.long)
    x[:, 0:2 * n_pairs:2], x[:, 1:2 * n_pairs:2] = keys, values
    order = torch.rand(batch_size, n_pairs, generator=generator).argsort(1)
    x[:, 2 * n_pairs:3 * n_pairs] = keys.gather(1, order)
    y = torch.full_like(x, -1)
    y[:, 2 * n_pairs:3 * n_pairs] = values.gather(1, order)
    return x, y


def induction_batch(batch_size, vocab_size=33, seq_len=64, min_len=8, generator=None):
    """A segment of min_len..seq_len/2 distinct random tokens (1..vocab_size-1), repeated, then filler 0s. Targets:
    the next token inside the second copy (-1 elsewhere), which only a look-back at the first copy predicts. The
    random length rules out a fixed-offset shortcut; an induction head (Olsson et al. 2022) solves it. Returns
    inputs, targets (B, seq_len) and the segment lengths (B,)."""
    half = seq_len // 2
    lengths = torch.randint(min_len, half + 1, (batch_size, 1), generator=generator)  # (B, 1)
    segment = torch.rand(batch_size, vocab_size - 1, generator=generator).argsort(1)[:, :half] + 1  # (B, half)
    t = torch.arange(seq_len)[None]  # (1, T)
    x = torch.where(t < 2 * lengths, segment.gather(1, (t % lengths).clamp(max=half - 1)), 0)
    y = torch.cat([x[:, 1:], torch.full((batch_size, 1), -1)], dim=1)
    y[(t < lengths) | (t >= 2 * lengths - 1)] = -1
    return x, y, lengths[:, 0]


@torch.no_grad()
def accuracy(model, x, y):
    model.eval()
    predicted = model(x)[0].argmax(-1)
    model.train()
    return (predicted[y >= 0] == y[y >= 0]).float().mean().item()


def train_synthetic(model_cfg, make_batch, steps, lr, evals, device, stop_at=0.995, eval_every=50, seed=0):
    """A short plain loop (train.py's AdamW, warmup + cosine schedule and gradient clipping) on freshly drawn
    batches; make_batch(it, generator) gives (x, y). Stops early once every eval set is at stop_at. Returns the model
    and the curve [(step, {name: accuracy})]."""
    torch.manual_seed(seed)
    model = build_model(model_cfg).to(device)
    train_cfg = TrainConfig(learning_rate=lr, min_lr=lr / 10, max_iters=steps, warmup_iters=50)
    optimizer = make_optimizer(model, train_cfg, device)
    generator = torch.Generator().manual_seed(seed + 1)
    evals = {name: (x.to(device), y.to(device)) for name, (x, y) in evals.items()}
    curve = []
    for it in range(steps + 1):
        if it % eval_every == 0 or it == steps:
            curve.append((it, {name: accuracy(model, x, y) for name, (x, y) in evals.items()}))
            if it == steps or min(curve[-1][1].values()) >= stop_at:
                break
        set_lr(optimizer, get_lr(it, train_cfg))
        x, y = make_batch(it, generator)
        train_step(model, optimizer, [(x.to(device), y.to(device))], grad_clip=train_cfg.grad_clip)
    return model.eval(), curve


# ---------------------------------------------------------------- the experiments ----------------------------------

def exp_scaling(ctx):
    """Why softmax(QKᵀ/√d_k): a dot product of two random unit-variance d_k-vectors has variance d_k, so unscaled
    scores grow with the head size and the softmax saturates (Vaswani et al. 2017, section 3.2.1)."""
    gen = torch.Generator().manual_seed(0)
    sizes, var_raw, var_scaled, ent_raw, ent_scaled = [4, 16, 64, 256, 1024], [], [], [], []
    for d in sizes:
        q, k = torch.randn(2000, d, generator=gen), torch.randn(2000, 64, d, generator=gen)  # 64 keys per query
        scores = (k @ q[:, :, None])[..., 0]  # (2000, 64)
        entropy = lambda s: -(s.softmax(-1) * s.log_softmax(-1)).sum(-1).mean().item() / math.log(64)
        var_raw.append(scores.var().item())
        var_scaled.append((scores / math.sqrt(d)).var().item())
        ent_raw.append(entropy(scores))
        ent_scaled.append(entropy(scores / math.sqrt(d)))
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    a.loglog(sizes, var_raw, "o-", label="q·k")
    a.loglog(sizes, var_scaled, "s-", label="q·k / √d_k")
    a.loglog(sizes, sizes, "k:", lw=0.8, label="d_k")
    a.set(xlabel="head size d_k", ylabel="variance of the score", title="score variance")
    b.semilogx(sizes, ent_raw, "o-", label="softmax(q·k)")
    b.semilogx(sizes, ent_scaled, "s-", label="softmax(q·k / √d_k)")
    b.set(xlabel="head size d_k", ylabel="entropy / log(64 keys)", title="attention spread over 64 keys", ylim=(0, 1))
    for ax in (a, b):
        ax.legend(fontsize=8)
    ctx.save(fig, "scaling.png", "random q, k ~ N(0, I), 2000 queries x 64 keys per size")
    i = sizes.index(64)
    ctx.row("scaling", "Var(q·k), d_k=64: unscaled / scaled", f"{var_raw[i]:.1f} / {var_scaled[i]:.2f}", "",
            "dot products of unit-variance vectors have variance d_k; /√d_k brings it to 1")
    ctx.row("scaling", "softmax entropy over 64 keys (fraction of uniform), d_k=64: unscaled / scaled",
            f"{ent_raw[i]:.2f} / {ent_scaled[i]:.2f}", "", "unscaled scores saturate the softmax (near one-hot)")


def autograd_depth(output):
    """The longest chain of dependent operations from any input to output: the steps no parallelism can skip."""
    depth, order, stack, seen = {}, [], [(output.grad_fn, False)], set()
    while stack:  # iterative post-order: the graph of a 4096-step recurrence is too deep for recursion
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((child, False) for child, _ in node.next_functions)
    for node in order:
        children = [depth.get(child, 0) for child, _ in node.next_functions if child is not None]
        depth[node] = 1 + max(children, default=0)
    return depth[output.grad_fn]


def max_hops(length, reads):
    """The path between the first and the last token (the farthest pair in a causal layer), counted by breadth-first
    search when position i feeds positions reads(i, length) in one step."""
    seen, frontier, hops = {0}, {0}, 0
    while length - 1 not in seen:
        frontier = {j for i in frontier for j in reads(i, length)} - seen
        seen |= frontier
        hops += 1
    return hops


def exp_paths(ctx):
    """Table 1 of "Attention Is All You Need", counted on our layers: work per layer, sequential operations and the
    path between the first and the last token; then the gradient that actually flows along that path."""
    gpt_cfg, lstm_cfg = ModelConfig(vocab_size=96, block_size=4096), lstm_preset(96)
    C, H = gpt_cfg.n_embd, lstm_cfg.n_embd
    block = GPT(gpt_cfg).transformer.h[0]
    cell = torch.nn.LSTMCell(H, H)  # the fused nn.LSTM hides its steps from autograd; the cell loop shows them
    table = []
    for T in (64, 256, 1024, 4096):
        x = torch.randn(1, T, C, requires_grad=True)
        gpt_depth = autograd_depth(block(x)[0].sum())
        h = c = torch.zeros(1, H)
        inputs = torch.randn(T, 1, H, requires_grad=True)
        for t in range(T):
            h, c = cell(inputs[t], (h, c))
        lstm_depth = autograd_depth(h.sum())
        gpt_flops = 2 * T * C * (3 * C + C + 8 * C) + 4 * T * T * C  # projections and MLP, then QKᵀ and AV
        lstm_flops = 2 * T * 4 * H * 2 * H  # four gates, each from x_t and h_{t-1}
        attention_hops = max_hops(T, lambda i, n: range(i + 1, n))  # each query reads every earlier key
        recurrent_hops = max_hops(T, lambda i, n: [i + 1] if i + 1 < n else [])  # h_t reads h_{t-1} only
        table.append((T, gpt_flops, lstm_flops, gpt_depth, lstm_depth, attention_hops, recurrent_hops))
    with open(ctx.out / "paths.md", "w") as f:
        f.write(f"| T | FLOPs/layer GPT (C={C}) | FLOPs/layer LSTM (H={H}) | sequential ops GPT | sequential ops LSTM "
                f"| max path GPT | max path LSTM |\n|---|---|---|---|---|---|---|\n")
        for T, gf, lf, gd, ld, ah, rh in table:
            f.write(f"| {T} | {gf / 1e6:,.0f}M | {lf / 1e6:,.0f}M | {gd} | {ld:,} | {ah} | {rh:,} |\n")
    for T, gf, lf, gd, ld, ah, rh in table[::3]:
        ctx.row("paths", f"sequential ops per layer (autograd depth), T={T}", gd, f"{ld:,}", "O(1) vs O(T)")
        ctx.row("paths", f"max path between two tokens (hops per layer), T={T}", ah, f"{rh:,}", "O(1) vs O(T)")
        ctx.row("paths", f"FLOPs per layer, T={T}", f"{gf / 1e6:,.0f}M", f"{lf / 1e6:,.0f}M",
                "attention pays T² in work for its O(1) path")
    gradient_paths(ctx)


def gradient_paths(ctx):
    """|∂ loss at the last position / ∂ embedding at t| against the distance T - t, for fresh and trained models:
    what the path length means for learning (Bengio et al. 1994; Hochreiter 1991)."""
    summary = lm_summary()
    if not all((LM_RUNS / f"lm-{name}" / "best.pt").exists() for name in ("gpt", "lstm")) or not summary:
        print("paths: no trained language models yet; running the lm experiment first")
        exp_lm(ctx)
        summary = lm_summary()
    fig, ax = plt.subplots(figsize=(7, 4))
    ratios = {}
    for name in ("gpt", "lstm"):
        trained_model, _ = load_model(LM_RUNS / f"lm-{name}")
        torch.manual_seed(0)
        fresh_model = type(trained_model)(trained_model.config).eval()  # the same architecture, untrained
        T, val = trained_model.config.block_size, load_split(summary[name]["data_dir"], "val")
        starts = torch.linspace(0, len(val) - T - 2, 32).long()
        windows = torch.stack([torch.from_numpy(val[s:s + T + 1].astype("int64")) for s in starts])
        for trained, model in ((False, fresh_model), (True, trained_model)):
            embedding = model.transformer.wte if isinstance(model, GPT) else model.wte
            captured = []  # the embedding output: a forward hook returning None keeps it as it is
            hook = embedding.register_forward_hook(lambda m, i, out: captured.append(out) or out.retain_grad())
            logits = model(windows[:, :-1])[0]
            hook.remove()
            F.cross_entropy(logits[:, -1], windows[:, -1]).backward()
            norms = captured[0].grad.norm(dim=-1).mean(0).flip(0)  # (T,): index = distance from the last token
            ax.semilogy(norms.numpy(), "-" if trained else ":", color="C0" if name == "gpt" else "C1",
                        label=f"{name} {'trained' if trained else 'untrained'}")
            if trained:
                ratios[name] = (norms[-16:].mean() / norms[1:17].mean()).item()
    ax.set(xlabel="distance T - t (tokens)", ylabel="|∂ loss_T / ∂ embedding_t|, mean of 32 windows",
           title="how strongly the last prediction's gradient reaches each earlier token")
    ax.legend(fontsize=8)
    ctx.save(fig, "gradient_paths.png", "default GPT vs configs/model/lstm.yaml, " + lm_detail(summary))
    ctx.row("paths", "trained: gradient reaching the 16 farthest / the 16 nearest tokens", f"{ratios['gpt']:.2g}",
            f"{ratios['lstm']:.2g}", "through a recurrence the gradient shrinks with distance")


def exp_throughput(ctx):
    """Training tokens/s (forward, backward, AdamW step) at equal parameters and equal tokens per step, against the
    sequence length; then a work-span estimate of the same on many processors."""
    configs = {"gpt": ModelConfig(vocab_size=96, block_size=1024), "lstm": lstm_preset(96)}
    torch.manual_seed(0)
    models = {name: build_model(cfg).to(ctx.device) for name, cfg in configs.items()}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    lengths, tokens = (64, 128, 256, 512, 1024), ctx.budget["throughput_tokens"]

    def step(name, x):
        train_step(models[name], optimizers[name], [(x[:, :-1], x[:, 1:])])

    measured = {name: [] for name in models}
    for T in lengths:
        x = torch.randint(96, (max(1, tokens // T), T + 1), generator=torch.Generator().manual_seed(T)).to(ctx.device)
        samples = {name: [] for name in models}
        for name in models:
            step(name, x)  # warm-up: allocator, kernels
        for r in range(ctx.budget["repeats"]):
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
             f"of {ctx.budget['repeats']}; estimate: f={f / 1e9:.1f} GFLOP/s per processor, τ={tau * 1e6:.0f} µs")
    for i in (0, len(lengths) - 1):
        T = lengths[i]
        ctx.row("throughput", f"training tokens/s measured here, T={T}", f"{measured['gpt'][i]:,.0f}",
                f"{measured['lstm'][i]:,.0f}", f"LSTM/GPT = {measured['lstm'][i] / measured['gpt'][i]:.2f}")
    ctx.row("throughput", f"work-span estimate, {P} processors, T=1024 (tokens/s)", f"{estimate['gpt'][-1]:,.0f}",
            f"{estimate['lstm'][-1]:,.0f}", f"span: GPT {span['gpt'](1024)} vs LSTM {span['lstm'](1024):,} steps")


def exp_recall(ctx):
    """Multi-query associative recall at 64 tokens: can the model look up, for each query, the value its key had?"""
    pairs, n_keys, warm_steps = (2, 4, 8, 16), 16, 250
    configs = synthetic_models(2 * n_keys + 1, 64)
    results, shown = {}, None
    for name, cfg in configs.items():
        for n in pairs:
            select = {n: recall_batch(256, n, generator=torch.Generator().manual_seed(100 + n))}
            test = recall_batch(1024, n, generator=torch.Generator().manual_seed(200 + n))
            # curriculum: the first warm_steps show 4 pairs, where the look-up circuit forms in ~150 steps
            make = lambda it, g, n=n: recall_batch(64, 4 if it < warm_steps else n, generator=g)
            runs = [(lr, *train_synthetic(cfg, make, ctx.budget["recall_steps"][name], lr, select, ctx.device))
                    for lr in ctx.budget["recall_lrs"][name]]
            lr, model, curve = max(runs, key=lambda r: r[2][-1][1][n])  # best lr on the selection set
            results[name, n] = dict(lr=lr, curve=curve, test=accuracy(model, *(t.to(ctx.device) for t in test)))
            print(f"recall {name} {n} pairs: lr {lr:g}, {curve[-1][0]} steps, test {results[name, n]['test']:.3f}")
            if name == "gpt" and n == 8:
                shown = model
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        a.plot(pairs, [100 * results[name, n]["test"] for n in pairs], "o-", color=color, label=name)
        for n, style in ((8, "--"), (16, "-")):
            curve = results[name, n]["curve"]
            b.plot([s for s, _ in curve], [100 * acc[n] for _, acc in curve], style, color=color,
                   label=f"{name}, {n} pairs")
    a.plot(pairs, [100 / n_keys] * len(pairs), "k:", lw=0.8, label="chance (1/16)")
    a.set_xscale("log", base=2)
    a.minorticks_off()
    a.set(xlabel="key-value pairs in 64 tokens", ylabel="query accuracy (%)", xticks=pairs, xticklabels=pairs,
          title="multi-query associative recall", ylim=(0, 102))
    b.set(xlabel="training step", ylabel="selection-set accuracy (%)", title="learning curves", ylim=(0, 102))
    for ax in (a, b):
        ax.legend(fontsize=8)
    n_gpt, n_lstm = (build_model(configs[n]).num_params() for n in ("gpt", "lstm"))
    steps = ctx.budget["recall_steps"]
    ctx.save(fig, "recall.png", f"2-layer GPT ({n_gpt:,} params, width 64) vs 2-layer LSTM ({n_lstm:,}, width "
             f"{configs['lstm'].n_embd}); up to {steps['gpt']} / {steps['lstm']} steps of 64 sequences (first "
             f"{warm_steps} at 4 pairs), lrs {ctx.budget['recall_lrs']}; runs stop at 99.5%")
    attention_figure(ctx, shown, *recall_batch(1, 8, generator=torch.Generator().manual_seed(7)), 8)
    accs = lambda name: " / ".join(f"{100 * results[name, n]['test']:.0f}" for n in pairs)
    ctx.row("recall", "MQAR accuracy % at 2 / 4 / 8 / 16 pairs (64 tokens)", accs("gpt"), accs("lstm"),
            f"equal size ({n_gpt:,} vs {n_lstm:,}); {steps['gpt']} / {steps['lstm']} steps at most")
    reached = lambda name: " / ".join(str(next((s for s, a in results[name, n]["curve"] if a[n] >= 0.99), "-"))
                                      for n in pairs)
    ctx.row("recall", "steps to 99% at 2 / 4 / 8 / 16 pairs", reached("gpt"), reached("lstm"), "- : not reached")


def attention_figure(ctx, model, x, y, n_pairs):
    maps = model.attention_maps(x.to(ctx.device))  # per layer (1, 1, T, T)
    end = 3 * n_pairs
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    tokens = x[0, :end].tolist()
    for layer, ax in enumerate(axes):
        ax.imshow(maps[layer][0, 0, :end, :end].cpu(), cmap="Blues", vmin=0, vmax=1)
        ax.set(title=f"layer {layer + 1}", xlabel="attended position (key)", ylabel="position (query)")
        ax.set_xticks(range(end), [str(t) for t in tokens], fontsize=5, rotation=90)
        ax.set_yticks(range(end), [str(t) for t in tokens], fontsize=5)
    for q in range(2 * n_pairs, end):  # circle where each query should look: the value right after its key
        key = tokens[:2 * n_pairs:2].index(tokens[q]) * 2
        axes[1].plot(key + 1, q, "o", mfc="none", mec="red", ms=5)
        axes[0].plot(key, key + 1, "o", mfc="none", mec="red", ms=5)
    fig.suptitle(f"trained GPT on {n_pairs} pairs: layer 1 tags each value with its key (previous token); in layer 2 "
                 f"each query reads the value after its key", fontsize=9)
    ctx.save(fig, "recall_attention.png", "tick labels are token ids (keys 1-16, values 17-32, filler 0); red "
             "circles mark the expected position")


def exp_induction(ctx):
    """A random segment repeated: copying it back needs a previous-token head and an induction head."""
    configs = synthetic_models(33, 64)
    select = {"second copy": induction_batch(256, generator=torch.Generator().manual_seed(300))[:2]}
    test = induction_batch(1024, generator=torch.Generator().manual_seed(400))[:2]
    results = {}
    for name, cfg in configs.items():
        make = lambda it, g: induction_batch(64, generator=g)[:2]
        lr = max(ctx.budget["recall_lrs"][name])  # 3e-3 for the GPT, 1e-2 for the LSTM: the best on recall
        model, curve = train_synthetic(cfg, make, ctx.budget["induction_steps"][name], lr, select, ctx.device)
        results[name] = dict(model=model, curve=curve, lr=lr, test=accuracy(model, *(t.to(ctx.device) for t in test)))
        print(f"induction {name}: {curve[-1][0]} steps, test accuracy {results[name]['test']:.3f}")
    x, _, lengths = induction_batch(256, generator=torch.Generator().manual_seed(500))
    maps = results["gpt"]["model"].attention_maps(x.to(ctx.device))
    rows = []  # per sequence: second-copy positions t, the positions before them, and after the earlier copy
    for b, S in enumerate(lengths.tolist()):
        t = torch.arange(S, 2 * S - 1)  # the scored positions: inside the second copy
        rows.append((b, t, t - 1, t - S + 1))
    prev = sum(maps[0][b, 0, t, p].mean().item() for b, t, p, _ in rows) / len(rows)
    induct = sum(maps[1][b, 0, t, s].mean().item() for b, t, _, s in rows) / len(rows)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        curve = results[name]["curve"]
        axes[0].plot([s for s, _ in curve], [100 * a["second copy"] for _, a in curve], color=color, label=name)
    axes[0].set(xlabel="training step", ylabel="accuracy on the second copy (%)", title="copying a repeat",
                ylim=(0, 102))
    axes[0].legend(fontsize=8)
    example = int((lengths == 24).nonzero()[0, 0]) if (lengths == 24).any() else 0
    for layer, ax in enumerate(axes[1:]):
        ax.imshow(maps[layer][example, 0].cpu(), cmap="Blues", vmin=0, vmax=1)
        ax.set(xlabel="attended position", ylabel="position", title=(
            f"layer 1: previous token ({100 * prev:.0f}% of weight)" if layer == 0 else
            f"layer 2: induction stripe ({100 * induct:.0f}% of weight)"))
    n_gpt, n_lstm = (results[n]["model"].num_params() for n in ("gpt", "lstm"))
    ctx.save(fig, "induction.png", f"2-layer GPT ({n_gpt:,} params) vs 2-layer LSTM ({n_lstm:,}); segments of "
             f"8-32 distinct tokens out of 32; {results['gpt']['curve'][-1][0]} / {results['lstm']['curve'][-1][0]} "
             f"steps of 64 sequences, lr {results['gpt']['lr']:g} / {results['lstm']['lr']:g}; maps: one sequence "
             f"with a {int(lengths[example])}-token segment")
    ctx.row("induction", "accuracy % on the repeated half", f"{100 * results['gpt']['test']:.1f}",
            f"{100 * results['lstm']['test']:.1f}", f"{results['gpt']['curve'][-1][0]} / "
            f"{results['lstm']['curve'][-1][0]} steps")
    ctx.row("induction", "GPT attention: layer 1 on the previous token / layer 2 on the induction target",
            f"{100 * prev:.0f}% / {100 * induct:.0f}%", "", "averaged over the second copy of 256 sequences")


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


def exp_lm(ctx):
    """Language modelling at equal parameters and equal wall-clock, each model trained by `python train.py`."""
    data = ["data=text", f"data.path={ctx.data_path}"] if ctx.data_path else []
    runs = {name: compose(*overrides, *data) for name, overrides in LM_MODELS.items()}  # what train.py will run
    data_dir = prepare(runs["gpt"].data, runs["gpt"].model.block_size)  # the models share the corpus
    vocab = load_meta(data_dir)["vocab_size"]
    configs = {name: replace(cfg.model, vocab_size=vocab) for name, cfg in runs.items()}  # as train.py sizes them
    seconds, summary = ctx.budget["lm_seconds"], {}
    step_time = {name: time_train_step(cfg, ctx.device) for name, cfg in configs.items()}
    for name, model_cfg in configs.items():
        iters = max(20, int(seconds / step_time[name]))  # the iterations that fill the same wall-clock budget
        out = LM_RUNS / f"lm-{name}"
        shutil.rmtree(out, ignore_errors=True)  # compare.py owns these runs; train.py never overwrites
        # fp32 and AdamW, as time_train_step timed them (auto would take bf16 where it is native; muon, Muon for the
        # GPT's blocks only)
        train_run([*LM_MODELS[name], *data, f"train.device={ctx.device}", "train.dtype=float32",
                   "train.optimizer=adamw", f"train.max_iters={iters}", f"train.eval_interval={max(1, iters // 8)}", "train.eval_iters=10",
                   f"train.warmup_iters={max(1, min(100, iters // 10))}", f"logger.log_interval={max(1, iters // 20)}",
                   f"out_dir={out}"])
        evals = read_metrics(out, "eval")
        summary[name] = dict(iters=iters, data_dir=str(data_dir), params=build_model(model_cfg).num_params(),
                             seconds=[r["elapsed_s"] for r in evals], val_loss=[r["val_loss"] for r in evals])
    (LM_RUNS / "summary.json").write_text(json.dumps(summary))
    common = min(s["seconds"][-1] for s in summary.values())
    at_common = {n: interpolate(common, s["seconds"], s["val_loss"]) for n, s in summary.items()}
    by_position = {name: loss_by_position(LM_RUNS / f"lm-{name}", data_dir) for name in configs}
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        a.plot(summary[name]["seconds"], summary[name]["val_loss"], "o-", color=color,
               label=f"{name} ({summary[name]['iters']} iters)")
        b.plot(range(1, len(by_position[name]) + 1), by_position[name], color=color, label=name)
    a.set(xlabel="wall-clock seconds (training + evaluation)", ylabel="validation loss (nats/token)",
          title="equal parameters, equal time")
    b.set(xlabel="position in the 128-token window", ylabel="validation loss (nats/token)",
          title="loss by context position (best checkpoint)")
    for ax in (a, b):
        ax.legend(fontsize=8)
    corpus = Path(ctx.data_path).name if ctx.data_path else "stdlib"
    ctx.save(fig, "lm.png", f"corpus {corpus}; default GPT vs configs/model/lstm.yaml; " + lm_detail(summary))
    ctx.row("lm", "parameters", f"{summary['gpt']['params']:,}", f"{summary['lstm']['params']:,}",
            f"corpus {corpus}, {vocab} chars")
    ctx.row("lm", f"val loss at equal time ({common:.0f} s)", f"{at_common['gpt']:.3f}", f"{at_common['lstm']:.3f}",
            f"{summary['gpt']['iters']} vs {summary['lstm']['iters']} iterations in about {seconds} s each")
    ctx.row("lm", "val loss at positions 1-8 / 121-128",
            f"{by_position['gpt'][:8].mean():.2f} / {by_position['gpt'][-8:].mean():.2f}",
            f"{by_position['lstm'][:8].mean():.2f} / {by_position['lstm'][-8:].mean():.2f}", "best checkpoints")


def train_run(overrides):
    """`python train.py OVERRIDES` from this working directory (relative paths mean what they mean here), on this
    process's torch threads; its progress and errors print as they come."""
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    if subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], env=env).returncode:
        sys.exit(f"compare: `python train.py {' '.join(overrides)}` failed; its error is above")


def time_train_step(model_cfg, device, batch_size=16):
    """Seconds per training step of model_cfg at train.py's default batch size and clipping (median of 3)."""
    torch.manual_seed(0)
    model = build_model(model_cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randint(model_cfg.vocab_size, (batch_size, model_cfg.block_size + 1)).to(device)
    times = []
    for _ in range(4):
        sync(device)
        t0 = time.perf_counter()
        train_step(model, optimizer, [(x[:, :-1], x[:, 1:])], grad_clip=TrainConfig().grad_clip)
        sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[1]


def interpolate(x, xs, ys):
    i = next(i for i in range(1, len(xs)) if xs[i] >= x)
    w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + w * (ys[i] - ys[i - 1])


@torch.no_grad()
def loss_by_position(out_dir, data_dir, windows=512):
    """Validation loss at each position of the window, for the best checkpoint in out_dir."""
    model, _ = load_model(out_dir)
    T, val = model.config.block_size, load_split(data_dir, "val")
    starts = torch.linspace(0, len(val) - T - 2, windows).long()
    batch = torch.stack([torch.from_numpy(val[s:s + T + 1].astype("int64")) for s in starts])  # (windows, T + 1)
    logits = model(batch[:, :-1])[0]
    return F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none").mean(0)  # (T,)


def lm_summary():
    path = LM_RUNS / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def lm_detail(summary):
    return "; ".join(f"{n}: {s['params']:,} params, {s['iters']} iters in {s['seconds'][-1]:.0f} s"
                     for n, s in summary.items())


# ---------------------------------------------------------------- the report ---------------------------------------

def write_report(ctx, ran, seconds):
    """Merge this run's rows into results.csv (keeping other experiments' rows), then rewrite results.md."""
    csv_path, runs_path = ctx.out / "results.csv", ctx.out / "runs.json"
    old = list(csv.DictReader(csv_path.open())) if csv_path.exists() else []
    replaced = set(ran) | {r["experiment"] for r in ctx.rows}  # paths may have run lm for its models
    rows = sorted([r for r in old if r["experiment"] not in replaced] + ctx.rows,
                  key=lambda r: EXPERIMENTS.index(r["experiment"]))  # stable: each experiment keeps its order
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, RESULT_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    runs = json.loads(runs_path.read_text()) if runs_path.exists() else {}
    for name in ran:
        runs[name] = dict(seconds=round(seconds[name]), preset=ctx.preset, hardware=ctx.hardware,
                          torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
    runs_path.write_text(json.dumps(runs, indent=1) + "\n")
    table = ["| experiment | measure | GPT (attention) | LSTM (recurrence) | note |", "|---|---|---|---|---|"]
    table += [f"| {r['experiment']} | {r['measure']} | {r['gpt']} | {r['lstm']} | {r['note']} |" for r in rows]
    lines = ["# Attention vs recurrence, measured", "",
             "Written by `python compare.py`; every number below comes from the run listed under it.", "",
             *table, "", "| experiment | preset | wall time | hardware | torch | date |", "|---|---|---|---|---|---|",
             *[f"| {n} | {r['preset']} | {r['seconds']} s | {r['hardware']} | {r['torch']} | {r['date']} |"
               for n, r in sorted(runs.items(), key=lambda kv: EXPERIMENTS.index(kv[0]))],
             "", "Figures: " + ", ".join(f"[{p.name}]({p.name})" for p in sorted(ctx.out.glob("*.png"))),
             "Complexity table by sequence length: [paths.md](paths.md)." if (ctx.out / "paths.md").exists() else ""]
    (ctx.out / "results.md").write_text("\n".join(lines).rstrip() + "\n")
    print("\n".join(table))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the stated budgets instead of the quick preset")
    parser.add_argument("--only", help=f"comma-separated experiments out of: {', '.join(EXPERIMENTS)}")
    parser.add_argument("--data-path", help="a UTF-8 text file for the lm experiment (default: the stdlib corpus)")
    parser.add_argument("--out", default="reports/attention_vs_rnn", help="where figures and tables go")
    parser.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu) | cpu | cuda")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for PyTorch; 0 keeps its default")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(EXPERIMENTS)
    if unknown := set(names) - set(EXPERIMENTS):
        parser.error(f"unknown experiment(s) {', '.join(sorted(unknown))}; pick from {', '.join(EXPERIMENTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        device = pick_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    preset = "full" if args.full else "quick"
    ctx = Context(preset, PRESETS[preset], device, Path(args.out), args.data_path, hardware_name(device))
    ctx.out.mkdir(parents=True, exist_ok=True)
    print(f"compare.py ({preset}) on {ctx.hardware}: {', '.join(names)}")
    run = dict(scaling=exp_scaling, throughput=exp_throughput, recall=exp_recall, induction=exp_induction,
               generation=exp_generation, lm=exp_lm, paths=exp_paths)  # in this order: paths reuses lm's models
    seconds = {}
    for name in sorted(names, key=list(run).index):
        t0 = time.time()
        run[name](ctx)
        seconds[name] = time.time() - t0
        print(f"{name}: {seconds[name]:.0f} s")
    write_report(ctx, names, seconds)
    print(f"total {sum(seconds.values()):.0f} s; results in {ctx.out}/results.md")


if __name__ == "__main__":
    main()
