"""Reason (a) on parallel hardware: the GPT against the LSTM of its size on one GPU, in under 8 minutes.

    python -m scripts.report.gpu                          # on a CUDA machine: out/report/gpu/
    python -m scripts.report.gpu --smoke                  # the same code on the CPU at tiny sizes, in seconds
    python -m scripts.report.gpu --data-path input.txt    # the LM runs on a text file (default: the stdlib corpus)

(i) training tokens/s at about 15M matched parameters (SDPA against cuDNN's LSTM) at T = 256 ... 4096 and fixed tokens
per step, median of alternating rounds; (ii) one train.py run of each for the same wall-clock budget. Each model by its
own recipe (RECIPES); each part skips, saying so, what the deadline leaves no time for. Every output says that only
--smoke has run until GPU_CHECKED is set after a GPU run's numbers have been read.
"""
import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import matplotlib
import torch

from attnlab.checkpoint import build_model
from attnlab.cli import at_least
from attnlab.config import ModelConfig, compose
from attnlab.optim import make_optimizer, train_step
from attnlab.record import read_metrics
from attnlab.runtime import autocast, autocast_dtype, configure
from data.corpus import load_meta, prepare
from scripts.report.tasks import VOCAB, length_axis, matched
from scripts.timing import Deadline, alternate, hardware_name

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

ROOT = Path(__file__).resolve().parents[2]  # the repository root, where train.py runs
GPU_CHECKED = False  # True once a GPU run's outputs have been read and found sane
# Each model's own recipe as train.py overrides: Muon at its config's muon_lr. The LSTM in fp32 (TF32 on CUDA): CUDA
# autocast hands cuDNN's RNN fp16 whatever it was asked for (aten/src/ATen/cudnn/AutocastRNN.cpp), unscaled under bf16.
RECIPES = {"gpt": ["train.optimizer=muon", "train.dtype=bfloat16"],
           "lstm": ["model=lstm", "train.optimizer=muon", "train.dtype=float32"]}
MAX_ITERS = 1_000_000  # an LM run's step cap and eval interval: beyond any budget, so the seconds end the run
# gpt: 5 x 512, heads of 64 (about 15.8M parameters); tokens: per step at every T; warmup, rounds: untimed and timed
# steps per length; lm_*: the LM runs' context, batch, seconds, log interval, eval batches, and the seconds a run
# spends outside its budget (start-up, the last evaluation and checkpoint), which the deadline reserves
SIZES = {
    "gpu": dict(gpt=dict(n_layer=5, n_embd=512, n_head=8), lengths=(256, 512, 1024, 2048, 4096), tokens=65536,
                warmup=3, rounds=10, lm_block=1024, lm_batch=32, lm_seconds=120, lm_log_interval=50, lm_eval_iters=20,
                lm_warmup=100, lm_overhead_s=45),
    "smoke": dict(gpt=dict(n_layer=2, n_embd=32, n_head=2), lengths=(16, 32), tokens=128, warmup=1, rounds=2,
                  lm_block=32, lm_batch=4, lm_seconds=2, lm_log_interval=5, lm_eval_iters=2, lm_warmup=2,
                  lm_overhead_s=10),
}


def model_pair(sizes, vocab, block_size):
    """The GPT of sizes["gpt"] and the 2-layer LSTM of its parameter count, both with tied heads."""
    gpt = ModelConfig(vocab_size=vocab, block_size=block_size, tie_weights=True, **sizes["gpt"])
    return matched(gpt, ("lstm",), n_layer=2)


def mixing_layer(model):
    """The layer that mixes positions: the GPT's first attention, the LSTM's recurrence."""
    return model.rnn if hasattr(model, "rnn") else model.transformer.h[0].attn


def output_dtype(layer, fn):
    """The dtype layer's output has while fn runs: whether autocast reached it (a fused recurrence may stay fp32)."""
    seen = []
    hook = layer.register_forward_hook(lambda m, i, out: seen.append(out[0] if isinstance(out, tuple) else out))
    fn()
    hook.remove()
    return str(seen[0].dtype).removeprefix("torch.")


def recipe_label(train_cfg):
    """A recipe's fields for the outputs, from the TrainConfig train.py runs with."""
    return dict(optimizer=train_cfg.optimizer, muon_lr=train_cfg.muon_lr, adamw_lr=train_cfg.learning_rate,
                min_lr=train_cfg.min_lr, train_dtype=train_cfg.dtype)


def predict_seconds(spent, T):
    """Seconds the next length T will take from spent ({T: seconds} so far), growing linearly with T from the last:
    at fixed tokens the LSTM's sequential steps grow so, the GPT's attention no faster. 0 before any."""
    if not spent:
        return 0.0
    last = max(spent)
    return spent[last] * T / last


def throughput(sizes, device, deadline, reserve_s, results):
    """Training tokens/s of both models, each by its recipe, at every length that the deadline leaves time for."""
    configs = model_pair(sizes, VOCAB, max(sizes["lengths"]))
    torch.manual_seed(0)
    models = {name: build_model(cfg).to(device) for name, cfg in configs.items()}
    recipes = {name: compose(*RECIPES[name]).train for name in models}
    amps = {name: autocast(device, autocast_dtype(device, recipes[name].dtype)) for name in models}
    results["models"] = {name: dict(shape=f"{cfg.n_layer}x{cfg.n_embd}", params=models[name].num_params(),
                                    **recipe_label(recipes[name])) for name, cfg in configs.items()}
    spent = {}
    for T in sizes["lengths"]:
        predicted = predict_seconds(spent, T)
        if not deadline.fits(predicted, reserve_s):
            results["skipped"].append(f"throughput T={T}: predicted {predicted:.0f} s, {deadline.left():.0f} s left "
                                      f"with {reserve_s:.0f} s kept for the LM runs")
            continue
        start = time.monotonic()
        B = max(1, sizes["tokens"] // T)
        x = torch.randint(VOCAB, (B, T + 1), generator=torch.Generator().manual_seed(T)).to(device)
        optimizers = {name: make_optimizer(m, recipes[name], device) for name, m in models.items()}
        fns = {name: partial(train_step, m, optimizers[name], [(x[:, :-1], x[:, 1:])], autocast=amps[name])
               for name, m in models.items()}
        dtypes = {name: output_dtype(mixing_layer(m), fns[name]) for name, m in models.items()}  # the first warm-up
        for _ in range(sizes["warmup"] - 1):
            for fn in fns.values():
                fn()  # allocator, kernels, cuDNN's plans
        seconds = alternate(fns, sizes["rounds"], device)
        for name in models:
            results["throughput"].append(dict(model=name, T=T, batch=B, tokens_per_s=round(B * T / seconds[name]),
                                              step_s=seconds[name], dtype=dtypes[name]))
        spent[T] = time.monotonic() - start


def lm_dtype(cfg, device):
    """The dtype the mixing layer's output has in train.py's forward for cfg (its model, its train.dtype's
    autocast): one forward of a short batch, from the same functions train.py builds with."""
    torch.manual_seed(0)
    model = build_model(cfg.model).to(device)
    x = torch.zeros(1, 8, dtype=torch.long, device=device)
    amp = autocast(device, autocast_dtype(device, cfg.train.dtype))

    def forward():
        with torch.no_grad(), amp:
            model(x)
    return output_dtype(mixing_layer(model), forward)


def train_lm_pair(sizes, device, data_path, out, deadline, results):
    """One train.py run per model, each by its recipe, for lm_seconds of training, where the deadline leaves time;
    an earlier run in out is replaced."""
    data = ["data=text", f"data.path={data_path}"] if data_path else []
    block = f"model.block_size={sizes['lm_block']}"
    vocab = load_meta(prepare(compose(block, *data).data, sizes["lm_block"]))["vocab_size"]  # before the timed runs
    configs = model_pair(sizes, vocab, sizes["lm_block"])
    results["lm_settings"] = dict(corpus=Path(data_path).name if data_path else "stdlib", vocab=vocab,
                                  block_size=sizes["lm_block"], batch_size=sizes["lm_batch"],
                                  seconds=sizes["lm_seconds"], evaluated="at step 0 (inside the budget) and after it")
    shapes = {"gpt": [f"model.{key}={value}" for key, value in sizes["gpt"].items()],
              "lstm": ["model.n_layer=2", f"model.n_embd={configs['lstm'].n_embd}", "model.tie_weights=true"]}
    for name in ("gpt", "lstm"):
        predicted = sizes["lm_seconds"] + sizes["lm_overhead_s"]
        if not deadline.fits(predicted):
            results["skipped"].append(f"lm {name}: predicted {predicted:.0f} s, {deadline.left():.0f} s left")
            continue
        run_dir = out / f"lm-{name}"
        overrides = [*RECIPES[name], *shapes[name], block, *data, f"train.device={device}",
                     f"train.time_budget_s={sizes['lm_seconds']}", f"train.max_iters={MAX_ITERS}",
                     f"train.eval_interval={MAX_ITERS}", f"train.eval_iters={sizes['lm_eval_iters']}",
                     f"train.warmup_iters={sizes['lm_warmup']}", f"train.batch_size={sizes['lm_batch']}",
                     f"logger.log_interval={sizes['lm_log_interval']}", "train.seed=0", f"out_dir={run_dir}"]
        cfg = compose(*overrides)
        cfg = replace(cfg, model=replace(cfg.model, vocab_size=vocab))  # as train.py sizes it to the corpus
        dtype = lm_dtype(cfg, device)
        if run_dir.exists():  # train.py never starts afresh over a checkpoint, and this report owns the folder
            print(f"lm {name}: replacing the earlier run in {run_dir}")
            shutil.rmtree(run_dir)
        code = train_py_exit_code(overrides)
        evals = read_metrics(run_dir, "eval") if code == 0 else []
        if not evals:
            results["skipped"].append(f"lm {name}: train.py failed (exit {code}); its error is above")
            continue
        last = evals[-1]
        tokens = last["iter"] * sizes["lm_batch"] * sizes["lm_block"]
        curve = [(r["elapsed_s"], r["train_loss"]) for r in read_metrics(run_dir, "log")]
        results["lm"].append(dict(model=name, params=build_model(cfg.model).num_params(), dtype=dtype,
                                  **recipe_label(cfg.train), steps=last["iter"], seconds=last["elapsed_s"],
                                  tokens=tokens, val_loss=last["val_loss"], evals=len(evals), train_curve=curve))


def train_py_exit_code(overrides):
    """`python train.py OVERRIDES` in this working directory; its exit code (its errors print as they come)."""
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides]).returncode


def recipe_text(r):
    """A row's recipe in a few words: its optimizer's lrs and dtype."""
    return f"{r['optimizer']} muon_lr={r['muon_lr']:g} adamw_lr={r['adamw_lr']:g}, {r['dtype']}"


def write(out, results):
    """results.json (everything), results.csv (one measure a row) and gpu.png, from what has been measured so far."""
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    with (out / "results.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["part", "model", "setting", "metric", "value"])
        for r in results["throughput"]:
            writer.writerow(["throughput", r["model"], f"T={r['T']} batch={r['batch']}, {r['dtype']}",
                             "training tokens/s", r["tokens_per_s"]])
        for r in results["lm"]:
            for metric in ("steps", "tokens", "seconds", "val_loss"):
                writer.writerow(["lm", r["model"], recipe_text(r), metric, r[metric]])
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        points = [r for r in results["throughput"] if r["model"] == name]
        if points:
            a.loglog([r["T"] for r in points], [r["tokens_per_s"] for r in points], "o-", color=color,
                     label=f"{name}, {points[0]['dtype']}")
        for r in results["lm"]:
            if r["model"] == name and r["train_curve"]:
                b.plot(*zip(*r["train_curve"]), "-", color=color,
                       label=f"{name}, {recipe_text(r)}: val {r['val_loss']:.3f} after {r['tokens']:,} tokens")
    if results["throughput"]:
        length_axis(a, sorted({r["T"] for r in results["throughput"]}), "sequence length T")
    a.set(ylabel="training tokens / s", title="throughput, each model's recipe")
    b.set(xlabel="seconds trained", ylabel="train loss (logged)", title="equal wall clock (train.py)")
    for ax in (a, b):
        if ax.lines:
            ax.legend(fontsize=7)
    models = " vs ".join(f"{name.upper()} {m['shape']} ({m['params']:,} params)"
                         for name, m in results.get("models", {}).items())
    fig.text(0.01, -0.02, f"{models}, heads tied, Muon for both; {results['sizes']['tokens']:,} tokens per step, "
             f"median of {results['sizes']['rounds']} alternating steps after {results['sizes']['warmup']}; LM runs: "
             f"{results['sizes']['lm_seconds']} s each, evaluated at step 0 and after the budget\n"
             f"{results['hardware']}; python -m scripts.report.gpu{' --smoke' * results['smoke']}; {results['note']}",
             fontsize=7, color="dimgray", va="top")
    fig.savefig(out / "gpu.png", dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/report/gpu", help="where results.json, results.csv and gpu.png go")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, in seconds: the code path only")
    parser.add_argument("--deadline-s", type=at_least(0, float), default=450,
                        help="wall-clock seconds for everything; a part "
                        "predicted not to finish in what is left is skipped and listed (default 450)")
    parser.add_argument("--data-path", help="a UTF-8 text file for the LM runs (default: the stdlib corpus)")
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        parser.error("no CUDA device here; --smoke runs the same code on the CPU at tiny sizes")
    deadline = Deadline(args.deadline_s)
    device = torch.device("cpu" if args.smoke else "cuda")
    configure(device)
    sizes = SIZES["smoke" if args.smoke else "gpu"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    note = ("checked on a GPU" if GPU_CHECKED else
            "scripts/report/gpu.py had not run on a GPU before this run: read its numbers with care")
    results = dict(hardware=hardware_name(device), torch=torch.__version__, date=time.strftime("%Y-%m-%d"),
                   smoke=args.smoke, note=note, sizes=sizes, throughput=[], lm=[], skipped=[])
    print(f"gpu report on {results['hardware']}; {note}")
    reserve = 2 * (sizes["lm_seconds"] + sizes["lm_overhead_s"])
    throughput(sizes, device, deadline, reserve, results)
    write(out, results)
    train_lm_pair(sizes, device, args.data_path, out, deadline, results)
    write(out, results)
    for line in results["skipped"]:
        print(f"skipped {line}")
    for r in results["throughput"]:
        print(f"{r['model']:>4} T={r['T']:>5}: {r['tokens_per_s']:>12,} tokens/s ({r['dtype']})")
    for r in results["lm"]:
        print(f"{r['model']:>4} lm ({recipe_text(r)}): val loss {r['val_loss']:.3f} after {r['steps']:,} steps, "
              f"{r['tokens']:,} tokens")
    print(f"results in {out}/results.json; {note}")


if __name__ == "__main__":
    main()
