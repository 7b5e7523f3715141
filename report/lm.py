"""Language modelling at equal parameters and equal wall-clock, each model trained by `python train.py`."""
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from checkpoint import build_model, load_model
from config import TrainConfig, compose
from data.corpus import load_meta, load_split, prepare
from runlog import read_metrics
from runtime import sync
from training import train_step

from report import RUNS

BUDGET = {"quick": dict(lm_seconds=60), "full": dict(lm_seconds=300)}
ROOT = Path(__file__).resolve().parent.parent
LM_MODELS = {"gpt": [], "lstm": ["model=lstm"]}  # the models as train.py overrides: the default GPT and
# configs/model/lstm.yaml, which has the same parameter count


def exp_lm(ctx):
    """Language modelling at equal parameters and equal wall-clock, each model trained by `python train.py`."""
    data = ["data=text", f"data.path={ctx.data_path}"] if ctx.data_path else []
    runs = {name: compose(*overrides, *data) for name, overrides in LM_MODELS.items()}  # what train.py will run
    data_dir = prepare(runs["gpt"].data, runs["gpt"].model.block_size)  # the models share the corpus
    vocab = load_meta(data_dir)["vocab_size"]
    configs = {name: replace(cfg.model, vocab_size=vocab) for name, cfg in runs.items()}  # as train.py sizes them
    seconds, summary = BUDGET[ctx.preset]["lm_seconds"], {}
    step_time = {name: time_train_step(cfg, ctx.device) for name, cfg in configs.items()}
    for name, model_cfg in configs.items():
        iters = max(20, int(seconds / step_time[name]))  # the iterations that fill the same wall-clock budget
        out = RUNS / f"lm-{name}"
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
    (RUNS / "summary.json").write_text(json.dumps(summary))
    common = min(s["seconds"][-1] for s in summary.values())
    at_common = {n: interpolate(common, s["seconds"], s["val_loss"]) for n, s in summary.items()}
    by_position = {name: loss_by_position(RUNS / f"lm-{name}", data_dir) for name in configs}
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
    path = RUNS / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def lm_detail(summary):
    return "; ".join(f"{n}: {s['params']:,} params, {s['iters']} iters in {s['seconds'][-1]:.0f} s"
                     for n, s in summary.items())

