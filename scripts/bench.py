"""Benchmarks: training throughput, sampling with and without the KV cache, attention time and memory, whole
training runs of the CPU speedrun against nanoGPT's recipe, and corpus preparation.

    python -m scripts.bench                          # train, sample, attention, generate (docs/speed.md)
    python -m scripts.bench --only train,attention   # some of the sections: train, sample, attention, generate
    python -m scripts.bench --only speedrun --data-path tinyshakespeare.txt   # 3 seeds of each recipe, about 11 minutes
    python -m scripts.bench --only speedrun --nanogpt ../nanoGPT ...   # nanoGPT's own code as the reference
    python -m scripts.bench --only ablation --data-path tinyshakespeare.txt   # the speedrun's levers, one at a time
    python -m scripts.bench --only ablation --levers momentum,bf16 ...   # the full recipe beside the levers named so
    python -m scripts.bench --only prepare --bpe-file gpt2.tiktoken   # MB/s and peak memory, 1 and 2 workers, 256 MB
    python -m scripts.bench --only vocab             # GPT-2's vocabulary on a small model: the loss chunked or plain
    python -m scripts.bench --quick                  # tiny sizes, one round: checks that everything runs
    python -m scripts.bench --device cuda            # bf16 autocast and torch.compile; MFU where the peak is known
    python -m scripts.bench --only gpu               # the GPU check, under 5 minutes: gpu_check.json (docs/speed.md)
    python -m scripts.bench --only gpu --smoke       # the same code on the CPU at tiny sizes, in seconds

What is compared runs alternately (A B A B ...) and the tables show medians over rounds, so a neighbour that slows a
shared machine for a while slows both sides. Warm-up steps and start-up are not timed, except in speedrun and
ablation, which time whole runs from launch to exit. Tables print as Markdown.
"""
import argparse
import collections
import contextlib
import itertools
import json
import math
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from attnlab import loss as loss_module
from attnlab.batches import get_batch
from attnlab.cli import at_least
from attnlab.config import compose
from attnlab.distributed import Processes, wrap
from attnlab.optim import make_optimizer, train_step
from attnlab.record import read_metrics
from attnlab.runtime import activation_dtype, autocast, autocast_dtype, configure, peak_flops, pick_device, sync
from model import GPT, CausalSelfAttention, GPTConfig
from scripts.timing import Deadline, hardware_name, layer_costs, peak_bytes, process_age_s, time_steps, token_times

ROOT = Path(__file__).resolve().parents[1]  # the repository root, where train.py runs
CHAR_VOCAB = 65  # tiny Shakespeare's characters
# sizes: call_s, seconds per timed call of training steps; rounds, of each A/B alternation (sample_rounds and
# gen_rounds for the slow sampling sections); new_tokens after an 8-token prompt at each context, timed per window
FULL = dict(call_s=0.5, rounds=5, sample_rounds=3, new_tokens=1000, window=100, contexts=(64, 256, 1024),
            lengths=(256, 1024, 4096), gen=dict(n_layer=6, n_head=6, n_embd=384, block_size=1024), gen_prompt=512,
            gen_new=512, gen_rounds=1, seeds=3, run=[], prepare_rounds=2)
QUICK = dict(call_s=0.0, rounds=1, sample_rounds=1, new_tokens=40, window=10, contexts=(16, 64), lengths=(64, 128),
             gen=dict(n_layer=2, n_head=2, n_embd=32, block_size=64), gen_prompt=16, gen_new=16, gen_rounds=1, seeds=1,
             run=["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=16", "train.max_iters=2"],
             prepare_rounds=1)
TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=32)  # --quick's model shape for the train section
# Whole runs of train.py, timed from launch to exit (start-up, data loading, every evaluation and the final one over
# the whole validation split included), each recipe with its own iteration count
REFERENCE, LONG_RECIPE = "nanoGPT CPU recipe", "speedrun_cpu_long"
PRESETS = {REFERENCE: ["experiment=nanogpt_cpu"], "speedrun_cpu": ["experiment=speedrun_cpu"],
           LONG_RECIPE: ["experiment=speedrun_cpu_long"]}
# with --nanogpt the reference is karpathy/nanoGPT's own train.py, run with its README's CPU command
NANOGPT = "nanoGPT's own train.py (its CPU command; val: its 20-batch estimate)"
NANOGPT_CPU = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
               "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
               "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
# experiment=speedrun_cpu with one lever changed at a time, each run its step count: the loss is then the same on every
# run of a seed (a time budget would add the machine's noise to it), and a slower step shows in the wall time
BASE = "speedrun_cpu, every lever"
LEVERS = {BASE: [], "AdamW instead of Muon": ["train.optimizer=adamw"],
          "learned positions instead of RoPE": ["model.pos=learned"],
          "LayerNorm instead of RMSNorm": ["model.norm=layernorm"], "GELU MLP instead of ReLU²": ["model.mlp=gelu"],
          "no QK-norm": ["model.qk_norm=false"],
          "Muon momentum 0.95 instead of 0.85": ["train.muon_momentum=0.95"],
          "nanoGPT's evaluation (20 batches every 250 steps)": ["train.eval_interval=250", "train.eval_iters=20"],
          "bf16 autocast where native (train.dtype=auto) instead of fp32": ["train.dtype=auto"],
          "warmup 100 steps instead of 30": ["train.warmup_iters=100"],
          "decay to zero instead of min_lr 1e-4": ["train.min_lr=0"],
          "4 layers instead of 3 (nanoGPT's depth)": ["model.n_layer=4"],
          "no n-gram embeddings": ["model.ngram=0"]}


def table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    print()


def train_section(args, device, sizes):
    gpt2_batch = 2 if args.quick else 8 if device.type == "cuda" else 1  # GPT-2 at a small batch on the CPU
    cases = {name: compose(*overrides) for name, overrides in PRESETS.items()}
    cases["GPT-2 124M"] = compose("model=gpt2", f"train.batch_size={gpt2_batch}")
    steps = {}
    for name, cfg in cases.items():
        vocab = CHAR_VOCAB if cfg.data.tokenizer == "char" else cfg.model.vocab_size
        model_cfg = replace(cfg.model, vocab_size=vocab, **(TINY if args.quick else {}))
        cfg = replace(cfg, model=model_cfg)
        torch.manual_seed(0)
        model = GPT(model_cfg).to(device)
        optimizer = make_optimizer(model, cfg.train, device)
        dtype = autocast_dtype(device, cfg.train.dtype)
        compiled = torch.compile(model) if device.type == "cuda" else model
        x, y = torch.randint(0, vocab, (2, cfg.train.batch_size, model_cfg.block_size), device=device)

        def step(compiled=compiled, optimizer=optimizer, dtype=dtype, x=x, y=y, clip=cfg.train.grad_clip):
            train_step(compiled, optimizer, [(x, y)], grad_clip=clip, autocast=autocast(device, dtype))

        steps[name] = (cfg, model, dtype, step)
    # warm-up steps (and compilation) first, then calls of about call_s each
    seconds = time_steps({name: s[3] for name, s in steps.items()}, sizes["rounds"], device,
                         warmup=1 if args.quick else 3, call_s=sizes["call_s"])
    peak, rows = peak_flops(device), []
    for name, (cfg, model, dtype, _) in steps.items():
        m, per_iter = cfg.model, statistics.median(seconds[name])
        tokens = cfg.train.batch_size * m.block_size / per_iter
        mfu = f"{model.flops_per_token() * tokens / peak:.1%}" if peak else "n/a"
        rows.append([name, f"{m.n_layer}x{m.n_embd}, T={m.block_size}, B={cfg.train.batch_size}",
                     f"{model.num_params() / 1e6:.2f}M", cfg.train.optimizer, str(dtype or torch.float32)[6:],
                     f"{per_iter * 1e3:.1f}", f"{tokens:,.0f}", mfu])
    print("### Training throughput (forward, backward, clip, optimizer step; synthetic batches)\n")
    table(["config", "shape", "params", "optimizer", "dtype", "ms/iter", "tokens/s", "MFU"], rows)


def compare_cache(model, prompt, new_tokens, rounds, device):
    """Per-token seconds with and without the KV cache, alternating; the per-round lists of each."""
    runs = {True: [], False: []}
    generator = torch.Generator(device).manual_seed(0)
    for _ in range(rounds):
        for kv_cache in runs:
            runs[kv_cache].append(token_times(model, prompt, new_tokens, kv_cache, device, generator))
    return runs


def sample_section(args, device, sizes):
    recipe = compose("experiment=nanogpt_cpu").model
    n, w, rows = sizes["new_tokens"], sizes["window"], []
    for context in sizes["contexts"]:
        model = GPT(replace(recipe, vocab_size=CHAR_VOCAB, block_size=context)).to(device).eval()
        prompt = torch.randint(0, CHAR_VOCAB, (1, 8), device=device)
        runs = compare_cache(model, prompt, n, sizes["sample_rounds"], device)
        speed = {kv: n / statistics.median(sum(r) for r in runs[kv]) for kv in runs}
        ms = {(kv, end): statistics.median(sum(r[window]) / w * 1e3 for r in runs[kv])  # first / last w tokens
              for kv in runs for end, window in (("first", slice(w)), ("last", slice(-w, None)))}
        rows.append([context, f"{speed[False]:,.0f}", f"{speed[True]:,.0f}", f"{speed[True] / speed[False]:.1f}x",
                     f"{ms[False, 'first']:.2f} / {ms[False, 'last']:.2f}",
                     f"{ms[True, 'first']:.2f} / {ms[True, 'last']:.2f}"])
    print(f"### Sampling: {n} tokens after an 8-token prompt, nanoGPT recipe's shape, batch 1\n")
    table(["context (block_size)", "tokens/s, recompute", "tokens/s, KV cache", "speed-up",
           f"ms/token first / last {w}, recompute", f"ms/token first / last {w}, KV cache"], rows)


def attention_section(args, device, sizes):
    """One attention layer's forward and backward, fused (SDPA) against the T x T weights written out: the report's
    long part times the same layers with the same code (scripts/timing.layer_costs)."""
    base = GPTConfig(n_embd=256, n_head=4, block_size=max(sizes["lengths"]))
    layers = {"fused (SDPA)": CausalSelfAttention(base, 0),
              "manual": CausalSelfAttention(replace(base, attn="manual"), 0)}
    seconds, memory, _ = layer_costs({name: layer.to(device) for name, layer in layers.items()}, sizes["lengths"],
                                     base.n_embd, sizes["rounds"], device)
    s, m = (lambda name, T: f"{seconds[name][T] * 1e3:.2f}"), (lambda name, T: f"{memory[name][T] / 2**20:.1f}")
    fused, manual = layers
    rows = [[T, s(fused, T), s(manual, T), m(fused, T), m(manual, T), f"{memory[fused][T] / memory[manual][T]:.3f}"]
            for T in sizes["lengths"]]
    print("### One causal self-attention layer, forward + backward (B=1, 4 heads of 64, fp32)\n")
    table(["T", "ms, fused", "ms, manual", "peak MiB, fused", "peak MiB, manual", "memory fused/manual"], rows)


def generate_section(args, device, sizes):
    recipe = compose("experiment=nanogpt_cpu").model
    model = GPT(replace(recipe, vocab_size=CHAR_VOCAB, **sizes["gen"])).to(device).eval()
    prompt = torch.randint(0, CHAR_VOCAB, (1, sizes["gen_prompt"]), device=device)
    runs = compare_cache(model, prompt, sizes["gen_new"], sizes["gen_rounds"], device)
    speed = {kv: sizes["gen_new"] / statistics.median(sum(r) for r in runs[kv]) for kv in runs}
    m = model.config
    print(f"### Generation: {sizes['gen_new']} tokens after a {sizes['gen_prompt']}-token prompt, "
          f"{m.n_layer}x{m.n_embd} model ({model.num_params() / 1e6:.1f}M), block_size={m.block_size}\n")
    table(["tokens/s, recompute", "tokens/s, KV cache", "speed-up"],
          [[f"{speed[False]:,.1f}", f"{speed[True]:,.1f}", f"{speed[True] / speed[False]:.1f}x"]])


def timed_train_py(overrides, seed, args, sizes):
    """One `python train.py` run: (wall seconds from launch to exit, iterations, whole-val loss, seconds trained)."""
    data = [f"data.path={args.data_path}"] if args.data_path else []
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)} if args.threads else None
    with tempfile.TemporaryDirectory() as out_dir:
        command = [sys.executable, "train.py", *overrides, *data, *sizes["run"], f"train.seed={seed}",
                   "train.final_eval=full", f"out_dir={out_dir}/run"]
        start = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if result.returncode:
            last_line = result.stderr.strip().splitlines()[-1:] or [f"exit status {result.returncode}"]
            sys.exit(f"bench: `{' '.join(command[1:])}` failed: {last_line[0]}")
        final = read_metrics(Path(out_dir) / "run", "eval")[-1]
    return wall, final["iter"], final["val_loss"], final["elapsed_s"]


def timed_nanogpt(args):
    """One run of nanoGPT's own train.py in the checkout args.nanogpt (NANOGPT_CPU), its text prepared there first by
    its own prepare.py from args.data_path: (wall seconds from launch to exit, iterations, its last val estimate,
    seconds its iterations took). It has no seed option: every run trains alike."""
    folder, data = Path(args.nanogpt), Path(args.nanogpt) / "data" / "shakespeare_char"
    if not (folder / "train.py").exists() or not (data / "prepare.py").exists():
        sys.exit(f"bench: --nanogpt {folder} is not a karpathy/nanoGPT checkout (no train.py or "
                 f"data/shakespeare_char/prepare.py); clone https://github.com/karpathy/nanoGPT and pass its folder")
    if not (data / "train.bin").exists():
        if args.data_path:
            shutil.copyfile(args.data_path, data / "input.txt")
        prepared = subprocess.run([sys.executable, "prepare.py"], cwd=data, capture_output=True, text=True)
        if prepared.returncode:
            last_line = prepared.stderr.strip().splitlines()[-1:] or [f"exit status {prepared.returncode}"]
            sys.exit(f"bench: nanoGPT's prepare.py in {data} failed: {last_line[0]}; pass --data-path "
                     f"tinyshakespeare.txt where it cannot download")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)} if args.threads else None
    with tempfile.TemporaryDirectory() as out_dir:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "train.py", *NANOGPT_CPU, f"--out_dir={out_dir}"], cwd=folder,
                                env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
    evals = re.findall(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", result.stdout)
    if result.returncode or not evals:
        last_line = result.stderr.strip().splitlines()[-1:] or [f"exit status {result.returncode}"]
        sys.exit(f"bench: nanoGPT's train.py in {folder} failed: {last_line[0]}")
    iteration_ms = re.findall(r"iter \d+: loss [\d.]+, time ([\d.]+)ms", result.stdout)
    return wall, int(evals[-1][0]), float(evals[-1][1]), sum(map(float, iteration_ms)) / 1000


def alternate_runs(cases, args, sizes, more_overrides=lambda name, runs: []):
    """Every case once per seed, in turn (A B C A B C ...), so a busy spell slows each case alike. A case is
    train.py's overrides, or None for nanoGPT's own train.py. more_overrides(name, runs so far) adds overrides to a
    case's run from the runs before it."""
    runs = {name: [] for name in cases}
    for seed in range(sizes["seeds"]):
        for name, overrides in cases.items():
            runs[name].append(timed_nanogpt(args) if overrides is None else
                              timed_train_py([*overrides, *more_overrides(name, runs)], seed, args, sizes))
    return runs


def long_recipe_budget(name, runs):
    """The long recipe trains for the reference's wall time in this seed's round, less the start-up and final
    evaluation that the short recipe's run took just before (its wall minus its seconds trained): its whole run
    then fits in the reference's (the first case's) time on whatever machine runs it."""
    if name != LONG_RECIPE:
        return []
    (reference_wall, *_), (short_wall, _, _, short_trained) = runs[next(iter(runs))][-1], runs["speedrun_cpu"][-1]
    return [f"train.time_budget_s={max(1.0, reference_wall - (short_wall - short_trained)):.1f}",
            "train.max_iters=100000"]  # the budget, not a step count, ends the run


def speedrun_section(args, device, sizes):
    cases = {NANOGPT: None, **{n: o for n, o in PRESETS.items() if n != REFERENCE}} if args.nanogpt else PRESETS
    runs = alternate_runs(cases, args, sizes, long_recipe_budget)
    reference = statistics.median(r[0] for r in next(iter(runs.values())))
    rows = []
    for name, results in runs.items():
        wall, iters, trained = (statistics.median(r[i] for r in results) for i in (0, 1, 3))
        rows.append([name, round(iters), f"{trained:.1f}", f"{wall:.1f}", f"{wall / reference:.0%}",
                     f"{statistics.median(r[2] for r in results):.4f}", ", ".join(f"{r[2]:.4f}" for r in results)])
    print(f"### Speedrun: whole runs of train.py, wall time from launch to exit, {sizes['seeds']} seed(s); "
          f"{LONG_RECIPE} trains for the reference's wall less the start-up and evaluation time\n")
    table(["recipe", "iters (median)", "trained s (median)", "wall s (median)", "wall vs nanoGPT",
           "whole-val loss (median)", "per seed"], rows)


def ablation_section(args, device, sizes):
    picked = {name: lever for name, lever in LEVERS.items()
              if name == BASE or not args.levers or any(word.lower() in name.lower() for word in args.levers)}
    runs = alternate_runs({name: ["experiment=speedrun_cpu", *lever] for name, lever in picked.items()}, args, sizes)
    losses = {name: statistics.median(r[2] for r in results) for name, results in runs.items()}
    walls = {name: statistics.median(r[0] for r in results) for name, results in runs.items()}
    rows = [[name, f"{walls[name]:.1f}", f"{walls[name] - walls[BASE]:+.1f}", f"{losses[name]:.4f}",
             f"{losses[name] - losses[BASE]:+.4f}", ", ".join(f"{r[2]:.4f}" for r in results)]
            for name, results in runs.items()]
    print(f"### Ablation: experiment=speedrun_cpu, one lever changed at a time, {sizes['seeds']} seed(s)\n")
    table(["change", "wall s (median)", "vs every lever", "whole-val loss (median)", "vs every lever", "per seed"],
          rows)


def synthetic_corpus(folder, megabytes, source=None, file_mb=1):
    """A folder of file_mb-sized text files, megabytes in all: lines of 12 words drawn at random (seeded) in their
    proportions in the text file source, or in Zipf's proportions from made-up words; files draw from 100k lines."""
    rng = random.Random(0)
    if source:
        counts = collections.Counter(re.findall(r"[\w']+|[^\w\s]", Path(source).read_text(encoding="utf-8")))
        words, weights = list(counts), list(counts.values())
    else:
        words = ["".join(rng.choice("etaoinshrdlucmfwypvbgk") for _ in range(rng.randint(1, 9))) for _ in range(5000)]
        weights = [1 / rank for rank in range(1, len(words) + 1)]
    cum_weights = list(itertools.accumulate(weights))  # once, not on each of the 100k draws: the same lines
    lines = [" ".join(rng.choices(words, cum_weights=cum_weights, k=12)).capitalize() + ".\n" for _ in range(100_000)]
    per_file = round(file_mb * 1e6 / (sum(map(len, lines)) / len(lines)))
    folder.mkdir(parents=True)
    for i in range(max(1, round(megabytes / file_mb))):
        (folder / f"doc{i:05d}.txt").write_text("".join(rng.choices(lines, k=per_file)))
    return sum(p.stat().st_size for p in folder.iterdir())


def tree_memory(pid):
    """Proportional set size (PSS: a page shared by n processes counts 1/n in each, so forked workers' shared pages
    count once) of process pid and all its descendants, in bytes, from /proc (Linux)."""
    total, pids = 0, [pid]
    while pids:
        pid = pids.pop()
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:  # it ended meanwhile
            continue
        total += next((int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Pss:")), 0)
        pids += [int(c) for c in children]
    return total


def prepare_run(overrides, data_dir):
    """`python -m data.prepare` on a fresh folder: (wall seconds from launch to exit, peak memory (PSS) of it and its
    workers together, sampled every 0.5 s, meta.json)."""
    shutil.rmtree(data_dir, ignore_errors=True)
    command = [sys.executable, "-m", "data.prepare", "data=text", f"data.dir={data_dir}", *overrides]
    start, peak = time.perf_counter(), 0
    with tempfile.TemporaryFile("w+") as stderr:  # a file, not a pipe: progress bars would fill a pipe and block
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        while process.poll() is None:
            peak = max(peak, tree_memory(process.pid))
            time.sleep(0.5)  # reading PSS walks page tables: sampled often, it slows what it measures
        wall = time.perf_counter() - start
        if process.returncode:
            stderr.seek(0)
            sys.exit(f"bench: `{' '.join(command[1:])}` failed: {stderr.read().strip().splitlines()[-1:]}")
    return wall, peak, json.loads(next(Path(data_dir).glob("*/meta.json")).read_text())


def prepare_section(args, device, sizes):
    megabytes = 2 if args.quick else args.prepare_mb
    tokenizers = {"char": [], **({"gpt2": [f"data.bpe_file={args.bpe_file}"]} if args.bpe_file else {}),
                  "bpe (4096, trained here)": ["data.tokenizer=bpe", "data.bpe_vocab_size=4096"]}
    with tempfile.TemporaryDirectory() as tmp:
        size = synthetic_corpus(Path(tmp) / "corpus", megabytes, args.data_path)
        cases = {(name, workers): [f"data.path={tmp}/corpus", f"data.num_proc={workers}",
                                   *([] if name == "char" else ["data.tokenizer=gpt2"]), *overrides]
                 for name, overrides in tokenizers.items() for workers in args.prepare_workers}
        runs = {case: [] for case in cases}
        rounds = args.prepare_rounds or sizes["prepare_rounds"]
        for _ in range(rounds):
            for case, overrides in cases.items():  # A B A B: every case once per round
                runs[case].append(prepare_run(overrides, Path(tmp) / "prepared"))
    rows = []
    for (name, workers), results in runs.items():
        wall, peak = (statistics.median(r[i] for r in results) for i in (0, 1))
        meta = results[0][2]
        rows.append([name, workers, f"{size / 1e6 / wall:.1f}", f"{wall:.1f}", f"{peak / 2 ** 20:,.0f}",
                     f"{meta['bytes_per_token']:.3f}", f"{meta['train_tokens'] + meta['val_tokens']:,}"])
    words = f"words of {Path(args.data_path).name}" if args.data_path else "made-up words"
    print(f"### Preparation: python -m data.prepare on {size / 1e6:,.0f} MB of random {words} in "
          f"{max(1, round(megabytes)):,} files, {rounds} round(s), launch to exit\n")
    table(["tokenizer", "workers", "MB/s", "wall s (median)", "peak memory MiB (PSS, process + workers)", "bytes/token",
           "tokens"], rows)


GPT2_VOCAB = 50257
VOCAB_SHAPE = dict(n_layer=2, n_head=2, n_embd=64, block_size=128)  # a model whose head is most of its FLOPs


def vocab_step(loss, batch_size, steps, seed=0):
    """In this process: `steps` AdamW training steps of a VOCAB_SHAPE GPT with GPT-2's vocabulary, the loss chunked
    (as train.py computes it) or plain (every logit held at once); returns tokens/s, peak resident MiB and the user
    and system CPU seconds per step, from getrusage."""
    if loss == "plain":
        loss_module.CHUNKED_LOSS_VOCAB = 10 ** 9
    torch.manual_seed(seed)
    model = GPT(replace(compose().model, **VOCAB_SHAPE, vocab_size=GPT2_VOCAB))
    optimizer = make_optimizer(model, compose("train.optimizer=adamw").train, torch.device("cpu"))
    x, y = torch.randint(0, GPT2_VOCAB, (2, batch_size, VOCAB_SHAPE["block_size"]))
    train_step(model, optimizer, [(x, y)])  # warm-up: the optimizer's state, the allocator's first pages
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(steps):
        train_step(model, optimizer, [(x, y)])
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return dict(tokens_per_s=batch_size * VOCAB_SHAPE["block_size"] * steps / seconds, peak_mib=after.ru_maxrss / 1024,
                user_s=(after.ru_utime - before.ru_utime) / steps, sys_s=(after.ru_stime - before.ru_stime) / steps)


def head_rate(batch_size, rounds=5):
    """Tokens/s if a step cost only the head's three matmuls (logits, and the gradients of the hidden states and of
    the weight), in fp32: the rate a large-vocabulary step at this shape can approach."""
    rows = batch_size * VOCAB_SHAPE["block_size"]
    h, w = torch.randn(rows, VOCAB_SHAPE["n_embd"]), torch.randn(GPT2_VOCAB, VOCAB_SHAPE["n_embd"])
    g = torch.randn(rows, GPT2_VOCAB)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        torch.mm(h, w.T)  # the logits
        torch.mm(g, w)  # their gradient's share of the hidden states'
        torch.mm(g.T, h)  # and of the weight's
        times.append(time.perf_counter() - start)
    return rows / statistics.median(times)


def vocab_section(args, device, sizes):
    batch_size, steps, rounds = (2, 2, 1) if args.quick else (16, 10, 2)
    threads = torch.get_num_threads()
    runs = collections.defaultdict(list)
    for _ in range(rounds):
        for loss in ("plain", "chunked"):  # one process each, alternating: peak memory is a process's own
            code = (f"import json, torch; torch.set_num_threads({threads}); from scripts.bench import vocab_step; "
                    f"print(json.dumps(vocab_step({loss!r}, {batch_size}, {steps})))")
            result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
            if result.returncode:
                sys.exit(f"bench: the {loss} vocabulary step failed: {result.stderr.strip().splitlines()[-1:]}")
            runs[loss].append(json.loads(result.stdout.splitlines()[-1]))
    rows = []
    for loss, results in runs.items():
        median = {key: statistics.median(r[key] for r in results) for key in results[0]}
        rows.append([f"{loss} loss", f"{median['tokens_per_s']:,.0f}", f"{median['peak_mib']:,.0f}",
                     f"{median['user_s']:.3f}", f"{median['sys_s']:.3f}"])
    rows.append(["the head's three matmuls alone", f"{head_rate(batch_size):,.0f}", "-", "-", "-"])
    shape = f"{VOCAB_SHAPE['n_layer']}x{VOCAB_SHAPE['n_embd']}, T={VOCAB_SHAPE['block_size']}, B={batch_size}"
    print(f"### GPT-2's vocabulary on a small model ({shape}, vocab {GPT2_VOCAB:,}, AdamW, fp32, {threads} thread(s), "
          f"medians of {rounds} process(es) each, {steps} steps)\n")
    table(["training step", "tokens/s", "peak MiB (max RSS)", "user s/step", "system s/step"], rows)


# gpu: GPT-2 124M's shape with nanoGPT's vocabulary, 50,257 padded to a multiple of 64, so figures compare with its;
# batch_size per step; warmup (compilation) and timed steps; loss_steps of bf16 against fp32 over loss_batches seeded
# batches taken in turn, so the loss falls as the model learns them; new_tokens sampled after a prompt of random
# tokens; ddp_steps through DDP; compile, torch.compile the training step; part_s, the seconds each part after the
# first needs, checked against the deadline
GPU_SIZES = dict(
    full=dict(shape=dict(n_layer=12, n_head=12, n_embd=768, block_size=1024), vocab_size=50257, padded_vocab=50304,
              batch_size=16, warmup=3, steps=20, loss_steps=50, loss_batches=4, prompt=256, new_tokens=256,
              ddp_steps=5, compile=True, window=256,
              part_s=dict(vocab=20, chunked=15, sdpa=10, syncs=10, losses=60, sample=30, ddp=60)),
    quick=dict(shape=dict(n_layer=2, n_head=2, n_embd=64, block_size=64), vocab_size=50257, padded_vocab=50304,
               batch_size=4, warmup=1, steps=2, loss_steps=5, loss_batches=2, prompt=8, new_tokens=8, ddp_steps=3,
               compile=False, window=16,
               part_s=dict(vocab=1, chunked=1, sdpa=1, syncs=1, losses=1, sample=1, ddp=1)),
)
# The check's constant learning rates, a sixth of the default recipe's peaks (AdamW's part, Muon's): without the
# recipe's warmup a peak lr makes the loss oscillate from the first steps and bf16's rounding grows into gaps of 0.1
# nats (docs/speed.md); the check compares numerics, not recipes
LOSS_LR = 3e-4
LOSS_MUON_LR = 3e-3
# bf16 autocast's per-step losses against fp32's from the same weights and batches, in nats: at LOSS_LR a small model
# stayed within 0.002 on a CPU (docs/speed.md); the margin is for a GPU's own bf16 kernels (flash attention)
LOSS_TOLERANCE = dict(max=0.05, mean=0.02)
# DDP on one process against the same steps without it, in nats: one process's all-reduce changes no gradient, so
# only the run-to-run noise of kernels that add in parallel (atomics) remains
DDP_TOLERANCE = 1e-3


@dataclass
class GpuCheck:
    """What the gpu section's parts share. Each part that trains starts again from the initial weights."""
    model: GPT  # the plain model, whose parameters every wrapper below shares
    step_model: torch.nn.Module  # what a training step calls: the model, compiled where compile is on
    initial: dict  # the model's state before any step
    cfg: object  # the default recipe (Muon, RoPE, RMSNorm, QK-norm, ReLU²) at LOSS_LR and LOSS_MUON_LR
    device: torch.device
    amp: object  # the bf16 autocast context
    compile: bool
    sizes: dict  # GPU_SIZES' full or quick
    deadline: Deadline
    batch: tuple = None  # the throughput part's (x, y), at the batch size that fitted


@contextlib.contextmanager
def full_fp32(device):
    """fp32 matmuls without TF32 while inside, on CUDA (configure turns TF32 on): the reference the bf16 run meets."""
    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def sdpa_kernels(model, batch, amp):
    """The attention kernels one training forward of model runs, by their aten names (flash_attention,
    efficient_attention, cudnn_attention, attention_math, flash_attention_for_cpu, ...)."""
    activities = [torch.profiler.ProfilerActivity.CPU]  # each kernel runs under an aten op, a CPU event
    with torch.profiler.profile(activities=activities) as prof, amp:
        model(*batch)
    prefix = "aten::_scaled_dot_product_"
    return sorted({e.key.removeprefix(prefix) for e in prof.key_averages() if e.key.startswith(prefix)})


def loss_curve(check, step_model, batches, steps, amp, all_mean=None):
    """Losses of up to `steps` training steps of step_model from the initial weights with a fresh optimizer, over
    batches taken in turn, stopping at the deadline; and the median seconds of a step after the first (which
    compiles)."""
    check.model.load_state_dict(check.initial)
    optimizer = make_optimizer(check.model, check.cfg.train, check.device)
    losses, times = [], []
    for i in range(steps):
        if check.deadline.left() <= 0:
            break
        sync(check.device)
        start = time.perf_counter()
        loss = train_step(step_model, optimizer, [batches[i % len(batches)]], grad_clip=check.cfg.train.grad_clip,
                          autocast=amp, all_mean=all_mean)
        losses.append(float(loss))  # a float or a device tensor, whichever train_step returns
        times.append(time.perf_counter() - start)
    return losses, statistics.median(times[1:] or times)


def warm_step(check, batch_size):
    """A training step at batch_size, run a few times (compilation, the allocator's first blocks, the optimizer's
    state); the step and a batch of its. Each step draws its batch as train.py does (attnlab.batches.get_batch: a
    gather from a token array, one pinned copy to the device), from random tokens in a prepared split's dtype."""
    config = check.model.config
    optimizer = make_optimizer(check.model, check.cfg.train, check.device)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, 64 * batch_size * config.block_size,
                                               dtype=np.uint16)
    generator = torch.Generator().manual_seed(0)

    def step():
        batch = get_batch(tokens, batch_size, config.block_size, generator, check.device)
        train_step(check.step_model, optimizer, [batch], grad_clip=check.cfg.train.grad_clip, autocast=check.amp)

    for _ in range(check.sizes["warmup"]):
        step()
    return step, get_batch(tokens, batch_size, config.block_size, generator, check.device)


def gpu_train(check):
    """Training tokens/s, MFU and peak memory at the batch size, or at half of it if that does not fit."""
    model, device, sizes = check.model, check.device, check.sizes
    batch_size = sizes["batch_size"]
    torch._dynamo.utils.counters.clear()
    started = time.perf_counter()
    try:
        step, check.batch = warm_step(check, batch_size)
    except torch.OutOfMemoryError:
        step = None
    if step is None:  # retried outside the except clause, whose traceback holds the failed step's tensors
        torch.cuda.empty_cache()
        batch_size //= 2
        step, check.batch = warm_step(check, batch_size)
    warm_s = time.perf_counter() - started  # the warm-up steps, the first of which compiles
    counters = torch._dynamo.utils.counters
    compiled = dict(warmup_s=warm_s, graphs=counters["stats"]["unique_graphs"],
                    graph_breaks=sum(counters["graph_break"].values()), recompiles=len(counters["recompiles"]))
    held = torch.cuda.memory_allocated(device) if device.type == "cuda" else None  # weights and optimizer state
    peak = peak_bytes(step, device)
    sync(device)
    start = time.perf_counter()
    for _ in range(sizes["steps"]):
        step()
    sync(device)
    seconds = (time.perf_counter() - start) / sizes["steps"]
    tokens_per_s = batch_size * model.config.block_size / seconds
    flops = peak_flops(device)
    return dict(batch_size=batch_size, block_size=model.config.block_size, vocab_size=model.config.vocab_size,
                params=model.num_params(), dtype="bfloat16", compile=check.compile, **compiled, peak_flops=flops,
                step_ms=seconds * 1e3,
                tokens_per_s=tokens_per_s, mfu=model.flops_per_token() * tokens_per_s / flops if flops else None,
                peak_step_mib=peak / 2**20, peak_total_mib=(held + peak) / 2**20 if held is not None else None)


def step_ms(check, model, batch, steps=3):
    """Median milliseconds of a training step of model on batch, after one unmeasured step."""
    optimizer = make_optimizer(model, check.cfg.train, check.device)
    times = []
    for _ in range(steps + 1):
        sync(check.device)
        start = time.perf_counter()
        train_step(model, optimizer, [batch], grad_clip=check.cfg.train.grad_clip, autocast=check.amp)
        sync(check.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def gpu_vocab(check):
    """train.py's GPT-2 vocabulary (50,257) against the same model padded to a multiple of 64 (50,304), eager: the
    step's milliseconds at each."""
    sizes, x, _ = check.sizes, *check.batch
    results = {}
    for vocab in (sizes["vocab_size"], sizes["padded_vocab"]):
        torch.manual_seed(0)
        model = GPT(replace(check.model.config, vocab_size=vocab)).to(check.device)
        tokens = x.clamp(max=vocab - 1)
        results[vocab] = step_ms(check, model, (tokens, tokens))
        del model
    return dict(step_ms=results, padded_over_plain=results[sizes["padded_vocab"]] / results[sizes["vocab_size"]])


def gpu_chunked(check):
    """One eager step through the chunked loss (attnlab/loss.py, forced: on a GPU it starts at 8 GiB of logits)
    against the plain loss, from the same weights and batch: milliseconds and the loss of each."""
    check.model.load_state_dict(check.initial)
    plain_ms = step_ms(check, check.model, check.batch, steps=1)
    saved = loss_module.CHUNKED_LOSS_GPU_BYTES
    loss_module.CHUNKED_LOSS_GPU_BYTES = 0
    try:
        check.model.load_state_dict(check.initial)
        with check.amp:
            chunked_loss = check.model(*check.batch)[1].item()
        chunked_ms = step_ms(check, check.model, check.batch, steps=1)
    finally:
        loss_module.CHUNKED_LOSS_GPU_BYTES = saved
    check.model.load_state_dict(check.initial)
    with check.amp:
        plain_loss = check.model(*check.batch)[1].item()
    return dict(chunk_rows=loss_module.chunk_rows(check.device.type, check.model.config.vocab_size),
                plain_ms=plain_ms, chunked_ms=chunked_ms, plain_loss=plain_loss, chunked_loss=chunked_loss)


def gpu_sdpa(check):
    """The attention kernels of the step training runs (compiled where compile is on), of the plain model, of a
    left-padded batch, of a sliding window, and of one-token decoding through the KV cache."""
    batch = check.batch  # the step's own inputs: another shape, or x passed as its own targets, compiles again
    model, x = check.model, check.batch[0]
    padded = torch.ones_like(x, dtype=torch.bool)
    padded[0, : x.size(1) // 4] = False  # one row left-padded by a quarter
    blocks = list(model.transformer.h)
    for block in blocks:
        block.attn.window = check.sizes["window"]
    try:
        windowed = sdpa_kernels(model, batch, check.amp)
    finally:
        for block in blocks:
            block.attn.window = model.config.window
    with torch.no_grad():  # check.amp entered once at a time: a nested re-entry would leave autocast on after it
        with check.amp:
            cache = model.new_cache(1, check.device, activation_dtype(model, check.device))
            model(x[:1, :-1], cache=cache)  # the prompt; then one token through the cache
        decoding = sdpa_kernels(lambda *a: model(x[:1, -1:], cache=cache), (), check.amp)
    return dict(training=sdpa_kernels(check.step_model, batch, check.amp), eager=sdpa_kernels(model, batch, check.amp),
                padded=sdpa_kernels(lambda *a: model(x, attention_mask=padded), (), check.amp), windowed=windowed,
                decoding=decoding)


def gpu_syncs(check):
    """Three training steps under torch.cuda.set_sync_debug_mode("error"): any host sync inside a step (a .item(), a
    data-dependent shape) raises, and the first one is reported. Only on CUDA."""
    if check.device.type != "cuda":
        return dict(skipped="no CUDA device: the sync debug mode needs one")
    step, _ = warm_step(check, check.batch[0].size(0))
    torch.cuda.synchronize(check.device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step()
        error = None
    except RuntimeError as e:
        error = str(e).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return dict(steps=3, passed=error is None, first_sync=error)


def gpu_losses(check):
    """bf16 autocast (the compiled step where compile is on) against plain fp32 (eager, no TF32), step by step from
    the same initial weights over the same seeded batches; the largest and mean gap against LOSS_TOLERANCE."""
    model, device, sizes = check.model, check.device, check.sizes
    shape = (sizes["loss_batches"], check.batch[0].size(0), model.config.block_size + 1)
    tokens = torch.randint(0, model.config.vocab_size, shape, generator=torch.Generator().manual_seed(0))
    batches = [(t[:, :-1], t[:, 1:]) for t in tokens.to(device)]  # views of (B, T + 1), as get_batch's: one compile
    bf16, bf16_s = loss_curve(check, check.step_model, batches, sizes["loss_steps"], check.amp)
    with full_fp32(device):
        fp32, fp32_s = loss_curve(check, model, batches, len(bf16), autocast(device, None))
    gaps = [abs(a - b) for a, b in zip(bf16, fp32)]
    finite = all(math.isfinite(loss) for loss in bf16 + fp32)
    largest, mean = max(gaps), statistics.mean(gaps)
    return dict(steps=len(gaps), complete=len(gaps) == sizes["loss_steps"], bf16=bf16, fp32=fp32,
                bf16_step_ms=bf16_s * 1e3, fp32_step_ms=fp32_s * 1e3, max_abs_diff=largest, mean_abs_diff=mean,
                tolerance=LOSS_TOLERANCE,
                passed=finite and largest <= LOSS_TOLERANCE["max"] and mean <= LOSS_TOLERANCE["mean"])


def gpu_sample(check):
    """Sampling tokens/s in eval mode under bf16 autocast, with and without the KV cache, after a random prompt."""
    model, device, sizes = check.model, check.device, check.sizes
    prompt = torch.randint(0, model.config.vocab_size, (1, sizes["prompt"]), device=device)
    model.eval()
    with check.amp:
        runs = compare_cache(model, prompt, sizes["new_tokens"], 2, device)
    model.train()
    rounds = {kv: [sizes["new_tokens"] / sum(r) for r in rs] for kv, rs in runs.items()}  # tokens/s per round
    speed = {kv: r[-1] for kv, r in rounds.items()}  # the first round warms up (and compiles nothing: eager)
    return dict(prompt=sizes["prompt"], new_tokens=sizes["new_tokens"], tokens_per_s_cache=speed[True],
                tokens_per_s_recompute=speed[False], speedup=speed[True] / speed[False],
                rounds_cache=rounds[True], rounds_recompute=rounds[False])


def gpu_ddp(check):
    """Training steps through DDP on a 1-process group (NCCL on CUDA, gloo on the CPU), the model wrapped as
    train.py wraps it, against the same steps without DDP: one process's all-reduce leaves the gradients as they
    are, so the losses match."""
    backend = "nccl" if check.device.type == "cuda" else "gloo"
    steps = check.sizes["ddp_steps"]
    plain, plain_s = loss_curve(check, check.step_model, [check.batch], steps, check.amp)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(backend, init_method=f"file://{tmp}/rendezvous", rank=0, world_size=1)
        try:
            procs = Processes(check.device, distributed=True)
            ddp, _ = wrap(check.model, check.compile, procs)
            losses, seconds = loss_curve(check, ddp, [check.batch], len(plain), check.amp, all_mean=procs.mean)
        finally:
            dist.destroy_process_group()
    tokens, gap = check.batch[0].numel(), max(abs(a - b) for a, b in zip(losses, plain))
    return dict(backend=backend, world_size=1, steps=len(losses), losses=losses, plain_losses=plain, max_abs_diff=gap,
                tolerance=DDP_TOLERANCE, passed=len(losses) == len(plain) and gap <= DDP_TOLERANCE,
                tokens_per_s=tokens / seconds, plain_tokens_per_s=tokens / plain_s)


GPU_PARTS = {"train": gpu_train, "vocab": gpu_vocab, "chunked": gpu_chunked, "sdpa": gpu_sdpa, "syncs": gpu_syncs,
             "losses": gpu_losses, "sample": gpu_sample, "ddp": gpu_ddp}


def gpu_summary(name, result):
    """One line for a part's result."""
    if name == "train":
        mfu = f"{result['mfu']:.1%}" if result["mfu"] is not None else "n/a"
        total = f"{result['peak_total_mib']:,.0f} MiB" if result["peak_total_mib"] is not None else "n/a"
        peak = f"{result['peak_flops'] / 1e12:,.0f} TFLOP/s" if result["peak_flops"] else "unknown"
        return (f"{result['tokens_per_s']:,.0f} tokens/s at B={result['batch_size']} x T={result['block_size']} "
                f"({result['step_ms']:.1f} ms/step), MFU {mfu} of a {peak} peak, peak memory {total} "
                f"({result['peak_step_mib']:,.0f} MiB beyond weights and optimizer state); warm-up "
                f"{result['warmup_s']:.1f} s (compiling), {result['graphs']} graph(s), {result['graph_breaks']} "
                f"graph break(s), {result['recompiles']} recompile(s)")
    if name == "sdpa":
        return "; ".join(f"{case} {', '.join(result[case]) or 'none seen'}" for case in
                         ("training", "eager", "padded", "windowed", "decoding"))
    if name == "losses":
        verdict = "PASS" if result["passed"] else "FAIL"
        if not result["complete"]:
            verdict += " (the deadline stopped it early)"
        return (f"{verdict}: {result['steps']} steps, bf16 {result['bf16'][0]:.4f} -> {result['bf16'][-1]:.4f}, fp32 "
                f"{result['fp32'][0]:.4f} -> {result['fp32'][-1]:.4f}; |gap| max {result['max_abs_diff']:.4f} "
                f"(<= {LOSS_TOLERANCE['max']}), mean {result['mean_abs_diff']:.4f} (<= {LOSS_TOLERANCE['mean']})")
    if name == "vocab":
        return ", ".join(f"vocab {v:,}: {ms:.1f} ms/step" for v, ms in result["step_ms"].items()) + (
            f" (eager; padded / plain {result['padded_over_plain']:.2f})")
    if name == "chunked":
        return (f"one step through the chunked loss ({result['chunk_rows']:,} rows a chunk) {result['chunked_ms']:.1f} "
                f"ms against the plain loss's {result['plain_ms']:.1f} ms; loss {result['chunked_loss']:.4f} vs "
                f"{result['plain_loss']:.4f}")
    if name == "syncs":
        if "skipped" in result:
            return f"skipped: {result['skipped']}"
        return ("PASS: no host sync in 3 steps" if result["passed"] else f"FAIL: a host sync in a step: "
                f"{result['first_sync']}")
    if name == "sample":
        return (f"{result['tokens_per_s_cache']:,.1f} tokens/s with the KV cache, "
                f"{result['tokens_per_s_recompute']:,.1f} recomputing ({result['speedup']:.1f}x)")
    verdict = "PASS" if result["passed"] else "FAIL"
    return (f"{verdict}: {result['backend']}, {result['steps']} steps, losses "
            f"{', '.join(f'{v:.4f}' for v in result['losses'])}, |gap| to the same steps without DDP "
            f"{result['max_abs_diff']:.2g} (<= {DDP_TOLERANCE:g}); {result['tokens_per_s']:,.0f} tokens/s")


def gpu_section(args, device, sizes):
    sizes = GPU_SIZES["quick" if args.quick else "full"]
    deadline = Deadline(args.deadline_s - process_age_s())  # from the process's start: imports and CUDA's count
    cfg = compose(f"train.learning_rate={LOSS_LR}", f"train.muon_lr={LOSS_MUON_LR}")
    model_cfg = replace(cfg.model, vocab_size=sizes["vocab_size"], **sizes["shape"])
    compile = sizes["compile"]
    torch.manual_seed(0)
    model = GPT(model_cfg).to(device)
    initial = {name: tensor.cpu().clone() for name, tensor in model.state_dict().items()}  # off the GPU's peak
    step_model, _ = wrap(model, compile, Processes(device))
    check = GpuCheck(model, step_model, initial, cfg, device, autocast(device, torch.bfloat16), compile, sizes,
                     deadline)
    results = dict(hardware=hardware_name(device), torch=torch.__version__, quick=args.quick,
                   deadline_s=args.deadline_s, sizes=sizes, skipped=[])
    out = Path(args.out)
    print(f"### GPU check: {model_cfg.n_layer}x{model_cfg.n_embd}, T={model_cfg.block_size}, vocab "
          f"{model_cfg.vocab_size:,}, the default recipe ({cfg.train.optimizer}, {model_cfg.pos}, {model_cfg.norm}, "
          f"qk_norm {model_cfg.qk_norm}, {model_cfg.mlp}), bf16 autocast{', torch.compile' * compile}, deadline "
          f"{args.deadline_s:.0f} s from the process's start\n")
    for name, part in GPU_PARTS.items():
        needed = sizes["part_s"].get(name, 0)
        if not deadline.fits(needed):
            results["skipped"].append(name)
            print(f"- {name}: skipped: deadline ({deadline.left():.0f} s left, {needed} s needed)")
            continue
        results[name] = part(check)
        print(f"- {name}: {gpu_summary(name, results[name])}")
        out.write_text(json.dumps(results, indent=1) + "\n")  # after each part: a killed run keeps what it measured
    results["seconds"] = args.deadline_s - deadline.left()
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\n{results['seconds']:.0f} s in all; every figure in {out}\n")


SECTIONS = {"train": train_section, "sample": sample_section, "attention": attention_section,
            "generate": generate_section, "speedrun": speedrun_section, "ablation": ablation_section,
            "prepare": prepare_section, "vocab": vocab_section, "gpu": gpu_section}
DEFAULT_SECTIONS = "train,sample,attention,generate"  # the whole-run sections take long: ask for them by name


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=DEFAULT_SECTIONS, help=f"comma-separated sections: {', '.join(SECTIONS)}")
    parser.add_argument("--quick", "--smoke", action="store_true",
                        help="tiny sizes and one round, to check the script runs")
    parser.add_argument("--device", help="cpu | cuda | cuda:1 ... (default: cuda for the gpu section without "
                        "--smoke, else cpu)")
    parser.add_argument("--threads", type=at_least(0), default=0, help="torch CPU threads; 0 keeps torch's default")
    parser.add_argument("--levers", type=lambda v: v.split(","), help="ablation: only the levers whose names "
                        "contain one of these comma-separated words (e.g. momentum,bf16), beside the full recipe")
    parser.add_argument("--data-path", help="tiny Shakespeare's text for speedrun and ablation (else it downloads)")
    parser.add_argument("--nanogpt", help="speedrun: a karpathy/nanoGPT checkout, whose own train.py (its README's "
                        "CPU command) is then the reference instead of experiment=nanogpt_cpu")
    parser.add_argument("--bpe-file", help="a gpt2.tiktoken ranks file: prepare also times GPT-2's tokenizer")
    parser.add_argument("--prepare-mb", type=at_least(0.001, float), default=256, help="prepare's corpus size in MB")
    parser.add_argument("--prepare-rounds", type=at_least(1), help="prepare's rounds (default 2, or 1 with --quick)")
    parser.add_argument("--deadline-s", type=at_least(0, float), default=270,
                        help="gpu: wall-clock seconds for the whole "
                        "check; a part that would not fit in what is left is skipped and says so (default 270)")
    parser.add_argument("--out", default="gpu_check.json", help="gpu: where its JSON goes (default gpu_check.json)")
    parser.add_argument("--prepare-workers", type=lambda v: [int(n) for n in v.split(",")], default=[1, 2],
                        help="prepare's worker counts, e.g. 1,2")
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - SECTIONS.keys()
    if unknown:
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}; use {', '.join(SECTIONS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    checking_gpu = "gpu" in args.only.split(",") and not args.quick
    smoke_hint = "; --smoke runs the gpu check on the CPU at tiny sizes" if checking_gpu else ""
    try:
        device = pick_device(args.device or ("cuda" if checking_gpu else "cpu"))
    except ValueError as e:
        parser.error(f"{e}{smoke_hint}")
    if checking_gpu and device.type != "cuda":  # GPT-2 124M's steps would take hours, past any deadline
        parser.error(f"the gpu check needs a CUDA device, not {device}{smoke_hint}")
    configure(device)
    print(f"## attnlab bench{' (quick)' if args.quick else ''}: {hardware_name(device)}, torch {torch.__version__}\n")
    sizes = QUICK if args.quick else FULL
    for name in SECTIONS:
        if name in args.only.split(","):
            generating = device.type == "cuda" and name in ("sample", "generate")
            with autocast(device, torch.bfloat16 if generating else None):
                SECTIONS[name](args, device, sizes)


if __name__ == "__main__":
    main()
