"""Benchmarks: training throughput, sampling with and without the KV cache, attention time and memory, whole
training runs of the CPU speedrun against nanoGPT's recipe, and corpus preparation.

    python -m scripts.bench                          # train, sample, attention, generate (about 8 minutes on 2 cores)
    python -m scripts.bench --only train,attention   # some of the sections: train, sample, attention, generate
    python -m scripts.bench --only speedrun --data-path tinyshakespeare.txt   # 3 seeds of each recipe, about 11 minutes
    python -m scripts.bench --only ablation --data-path tinyshakespeare.txt   # the speedrun's levers, one at a time
    python -m scripts.bench --only ablation --levers momentum,bf16 ...   # the full recipe beside the levers named so
    python -m scripts.bench --only prepare --bpe-file gpt2.tiktoken   # MB/s and peak memory, 1 and 2 workers, 256 MB
    python -m scripts.bench --only vocab             # GPT-2's vocabulary on a small model: the loss chunked or plain
    python -m scripts.bench --quick                  # tiny sizes, one round: checks that everything runs
    python -m scripts.bench --device cuda            # bf16 autocast and torch.compile; MFU where the peak is known

What is compared runs alternately (A B A B ...) and the tables show medians over rounds, so a neighbour that slows a
shared machine for a while slows both sides. Warm-up steps and start-up are not timed, except in speedrun and
ablation, which time whole runs from launch to exit. Tables print as Markdown.
"""
import argparse
import collections
import itertools
import json
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
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

import model as model_module
from attnlab.config import compose
from attnlab.decode import generate_stream
from attnlab.optim import make_optimizer, train_step
from attnlab.record import read_metrics
from attnlab.runtime import (
    alternate,
    autocast,
    autocast_dtype,
    configure,
    hardware_name,
    peak_bytes,
    peak_flops,
    pick_device,
    sync,
)
from model import GPT, manual_attention

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
RECIPES = {REFERENCE: ["experiment=nanogpt_cpu"], "speedrun_cpu": ["experiment=speedrun_cpu"],
           LONG_RECIPE: ["experiment=speedrun_cpu_long"]}
# experiment=speedrun_cpu with one lever changed at a time, each run its 300 steps: the loss is then the same on every
# run of a seed (a time budget would add the machine's noise to it), and a slower step shows in the wall time
BASE = "speedrun_cpu, every lever"
LEVERS = {BASE: [], "AdamW instead of Muon": ["train.optimizer=adamw"],
          "learned positions instead of RoPE": ["model.pos=learned"],
          "LayerNorm instead of RMSNorm": ["model.norm=layernorm"], "GELU MLP instead of ReLU²": ["model.mlp=gelu"],
          "no QK-norm": ["model.qk_norm=false"],
          "Muon momentum 0.95 instead of 0.85": ["train.muon_momentum=0.95"],
          "nanoGPT's evaluation (20 batches every 250 steps)": ["train.eval_interval=250", "train.eval_iters=20"],
          "bf16 autocast where native (train.dtype=auto) instead of fp32": ["train.dtype=auto"]}


def table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    print()


def train_section(args, device, sizes):
    gpt2_batch = 2 if args.quick else 8 if device.type == "cuda" else 1  # GPT-2 at a small batch on the CPU
    cases = {name: compose(*overrides) for name, overrides in RECIPES.items()}
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

        for _ in range(1 if args.quick else 3):  # warm-up (and compilation)
            step()
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        repeat = max(1, round(sizes["call_s"] / (time.perf_counter() - start)))  # steps per timed call
        steps[name] = (cfg, model, dtype, repeat, lambda step=step, repeat=repeat: [step() for _ in range(repeat)])
    seconds = alternate({name: s[4] for name, s in steps.items()}, sizes["rounds"], device)
    peak, rows = peak_flops(device), []
    for name, (cfg, model, dtype, repeat, _) in steps.items():
        m, per_iter = cfg.model, seconds[name] / repeat
        tokens = cfg.train.batch_size * m.block_size / per_iter
        mfu = f"{model.flops_per_token() * tokens / peak:.1%}" if peak else "n/a"
        rows.append([name, f"{m.n_layer}x{m.n_embd}, T={m.block_size}, B={cfg.train.batch_size}",
                     f"{model.num_params() / 1e6:.2f}M", cfg.train.optimizer, str(dtype or torch.float32)[6:],
                     f"{per_iter * 1e3:.1f}", f"{tokens:,.0f}", mfu])
    print("### Training throughput (forward, backward, clip, optimizer step; synthetic batches)\n")
    table(["config", "shape", "params", "optimizer", "dtype", "ms/iter", "tokens/s", "MFU"], rows)


def time_tokens(model, prompt, new_tokens, kv_cache, device, generator):
    """Seconds for each new token, from the prompt on."""
    times, last = [], time.perf_counter()
    for _ in generate_stream(model, prompt, new_tokens, kv_cache=kv_cache, generator=generator):
        sync(device)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times


def compare_cache(model, prompt, new_tokens, rounds, device):
    """Per-token seconds with and without the KV cache, alternating; the per-round lists of each."""
    runs = {True: [], False: []}
    generator = torch.Generator(device).manual_seed(0)
    for _ in range(rounds):
        for kv_cache in runs:
            runs[kv_cache].append(time_tokens(model, prompt, new_tokens, kv_cache, device, generator))
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
    paths = {"fused (SDPA)": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             "manual": lambda q, k, v: manual_attention(q, k, v, None, True)[0]}
    rows = []
    for T in sizes["lengths"]:
        q, k, v, grad = (torch.randn(1, 4, T, 64, device=device, requires_grad=i < 3) for i in range(4))

        def step(attend):
            q.grad = k.grad = v.grad = None
            attend(q, k, v).backward(grad)

        fns = {name: lambda attend=attend: step(attend) for name, attend in paths.items()}
        for fn in fns.values():
            fn()
        seconds = alternate(fns, sizes["rounds"], device)
        memory = {}
        for name, fn in fns.items():
            q.grad = k.grad = v.grad = None  # freed before measuring, so the peak counts this call's tensors only
            memory[name] = peak_bytes(fn, device)
        fused, manual = paths
        rows.append([T, f"{seconds[fused] * 1e3:.2f}", f"{seconds[manual] * 1e3:.2f}",
                     f"{memory[fused] / 2**20:.1f}", f"{memory[manual] / 2**20:.1f}",
                     f"{memory[fused] / memory[manual]:.3f}"])
    print("### Causal attention, forward + backward (B=1, n_head=4, head size 64, fp32)\n")
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


def train_run(overrides, seed, args, sizes):
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


def alternate_runs(cases, args, sizes, more_overrides=lambda name, runs: []):
    """Every case once per seed, in turn (A B C A B C ...), so a busy spell slows each case alike.
    more_overrides(name, runs so far) adds overrides to a case's run from the runs before it."""
    runs = {name: [] for name in cases}
    for seed in range(sizes["seeds"]):
        for name, overrides in cases.items():
            runs[name].append(train_run([*overrides, *more_overrides(name, runs)], seed, args, sizes))
    return runs


def long_recipe_budget(name, runs):
    """The long recipe trains for the reference's wall time in this seed's round, less the start-up and final
    evaluation that the short recipe's run took just before (its wall minus its seconds trained): its whole run
    then fits in the reference's time on whatever machine runs it."""
    if name != LONG_RECIPE:
        return []
    (reference_wall, *_), (short_wall, _, _, short_trained) = runs[REFERENCE][-1], runs["speedrun_cpu"][-1]
    return [f"train.time_budget_s={max(1.0, reference_wall - (short_wall - short_trained)):.1f}",
            "train.max_iters=100000"]  # the budget, not a step count, ends the run


def speedrun_section(args, device, sizes):
    runs = alternate_runs(RECIPES, args, sizes, long_recipe_budget)
    reference = statistics.median(r[0] for r in runs[REFERENCE])
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
        model_module.CHUNKED_LOSS_VOCAB = 10 ** 9
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


SECTIONS = {"train": train_section, "sample": sample_section, "attention": attention_section,
            "generate": generate_section, "speedrun": speedrun_section, "ablation": ablation_section,
            "prepare": prepare_section, "vocab": vocab_section}
DEFAULT_SECTIONS = "train,sample,attention,generate"  # the whole-run sections take long: ask for them by name


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=DEFAULT_SECTIONS, help=f"comma-separated sections: {', '.join(SECTIONS)}")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and one round, to check the script runs")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:1 ...")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 keeps torch's default")
    parser.add_argument("--levers", type=lambda v: v.split(","), help="ablation: only the levers whose names "
                        "contain one of these comma-separated words (e.g. momentum,bf16), beside the full recipe")
    parser.add_argument("--data-path", help="tiny Shakespeare's text for speedrun and ablation (else it downloads)")
    parser.add_argument("--bpe-file", help="a gpt2.tiktoken ranks file: prepare also times GPT-2's tokenizer")
    parser.add_argument("--prepare-mb", type=float, default=256, help="prepare's corpus size in MB")
    parser.add_argument("--prepare-rounds", type=int, help="prepare's rounds (default 2, or 1 with --quick)")
    parser.add_argument("--prepare-workers", type=lambda v: [int(n) for n in v.split(",")], default=[1, 2],
                        help="prepare's worker counts, e.g. 1,2")
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - SECTIONS.keys()
    if unknown:
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}; use {', '.join(SECTIONS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        device = pick_device(args.device)
    except ValueError as e:
        parser.error(str(e))
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
