"""Reason (a) on parallel hardware: the GPT against the LSTM of its size on one GPU, in under 8 minutes.

    python -m scripts.report.gpu                          # on a CUDA machine: out/report/gpu/
    python -m scripts.report.gpu --smoke                  # the same code on the CPU at tiny sizes, in seconds
    python -m scripts.report.gpu --data-path input.txt    # the LM runs on a text file (default: the stdlib corpus)

Two parts, each checking the time left before --deadline-s and skipping, with a line saying so, what it predicts
cannot finish: (i) training tokens/s at about 15M matched parameters in bf16 autocast, model.py's GPT (SDPA: flash
attention where the GPU has it) against attnlab/rnn.py's LSTM (torch.nn.LSTM: cuDNN on CUDA), at T = 256 ... 4096
and fixed tokens per step, after a warm-up, synchronised, median of alternating rounds; (ii) one language-model run
of each by train.py for the same wall-clock budget (train.time_budget_s), at learning rates fixed from the CPU
report's grids. results.json, results.csv and gpu.png are written as each part ends.

Not yet run on a GPU: when this was written none was lent, so only --smoke (on a CPU) has run; every output says
so until GPU_CHECKED below is set, after a first GPU run's numbers have been read.
"""
import argparse
import csv
import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import matplotlib
import torch

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig, compose
from attnlab.optim import train_step
from attnlab.record import read_metrics
from attnlab.runtime import alternate, autocast, configure, hardware_name
from data.corpus import load_meta, prepare
from scripts.report.cost import length_axis
from scripts.report.lm import ROOT, lm_summary
from scripts.report.tasks import rnn_width

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

GPU_CHECKED = False  # True once a GPU run's outputs have been read and found sane
VOCAB = 96  # the throughput part's random tokens: the stdlib corpus's characters
# AdamW peaks the committed CPU report's full lm grid chose (scripts/report/results/full/results.csv, the lm rows),
# used where out/compare/lm/summary.json (the last lm experiment's choice) is absent
LRS = dict(gpt=3e-3, lstm=1e-2)
# gpt: the GPT's shape (5 x 512, heads of 64: about 15.8M parameters); tokens: per training step at every T;
# warmup, rounds: untimed and timed (alternating) steps per length; lm_*: the LM runs' context, batch, seconds of
# training each, eval interval and batches, and the seconds a run spends outside its budget (start-up, corpus,
# evals, checkpoints), which the deadline reserves
SIZES = {
    "gpu": dict(gpt=dict(n_layer=5, n_embd=512, n_head=8), lengths=(256, 512, 1024, 2048, 4096), tokens=65536,
                warmup=3, rounds=10, lm_block=1024, lm_batch=32, lm_seconds=120, lm_eval_interval=200, lm_eval_iters=20,
                lm_warmup=100, lm_overhead_s=45),
    "smoke": dict(gpt=dict(n_layer=2, n_embd=32, n_head=2), lengths=(16, 32), tokens=128, warmup=1, rounds=2,
                  lm_block=32, lm_batch=4, lm_seconds=2, lm_eval_interval=20, lm_eval_iters=2, lm_warmup=2,
                  lm_overhead_s=10),
}


class Deadline:
    """Seconds left before a wall-clock end, and whether predicted work fits in them beside a reserve."""

    def __init__(self, seconds, clock=time.monotonic):
        self.clock, self.end = clock, clock() + seconds

    def left(self):
        return self.end - self.clock()

    def fits(self, predicted_s, reserve_s=0.0):
        return self.left() > 0 and predicted_s + reserve_s <= self.left()


def model_pair(sizes, vocab, block_size):
    """The GPT of sizes["gpt"] and the 2-layer LSTM of its parameter count (rnn_width), both with tied heads."""
    gpt = ModelConfig(vocab_size=vocab, block_size=block_size, tie_weights=True, **sizes["gpt"])
    width = rnn_width(build_model(gpt).num_params(), vocab, tied=True)
    return {"gpt": gpt, "lstm": ModelConfig(type="lstm", vocab_size=vocab, block_size=block_size, n_layer=2,
                                            n_embd=width, tie_weights=True)}


def output_dtype(layer, fn):
    """The dtype layer's output has while fn runs: whether autocast reached it (a fused recurrence may stay fp32)."""
    seen = []
    hook = layer.register_forward_hook(lambda m, i, out: seen.append(out[0] if isinstance(out, tuple) else out))
    fn()
    hook.remove()
    return str(seen[0].dtype).removeprefix("torch.")


def predict_seconds(spent, T):
    """Seconds the next length T will take from spent ({T: seconds} so far), growing linearly with T from the last:
    at fixed tokens the LSTM's sequential steps grow so, the GPT's attention no faster. 0 before any."""
    if not spent:
        return 0.0
    last = max(spent)
    return spent[last] * T / last


def throughput(sizes, device, deadline, reserve_s, results):
    """Training tokens/s of both models at every length that the deadline leaves time for."""
    configs = model_pair(sizes, VOCAB, max(sizes["lengths"]))
    torch.manual_seed(0)
    models = {name: build_model(cfg).to(device) for name, cfg in configs.items()}
    amp = autocast(device, torch.bfloat16)
    results["models"] = {name: dict(shape=f"{cfg.n_layer}x{cfg.n_embd}", params=models[name].num_params())
                         for name, cfg in configs.items()}
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
        optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=device.type == "cuda")
                      for name, m in models.items()}
        fns = {name: partial(train_step, m, optimizers[name], [(x[:, :-1], x[:, 1:])], autocast=amp)
               for name, m in models.items()}
        layers = {"gpt": models["gpt"].transformer.h[0].attn, "lstm": models["lstm"].rnn}
        dtypes = {name: output_dtype(layers[name], fns[name]) for name in models}  # the first warm-up step
        for _ in range(sizes["warmup"] - 1):
            for fn in fns.values():
                fn()  # allocator, kernels, cuDNN's plans
        seconds = alternate(fns, sizes["rounds"], device)
        for name in models:
            results["throughput"].append(dict(model=name, T=T, batch=B, tokens_per_s=round(B * T / seconds[name]),
                                              step_s=seconds[name], dtype=dtypes[name]))
        spent[T] = time.monotonic() - start


def learning_rates():
    """Each model's AdamW peak: the last CPU lm experiment's choice where out/compare/lm/summary.json has one, else
    LRS; and where it came from."""
    summary = lm_summary()
    if summary:
        return {name: summary[name]["lr"] for name in LRS}, f"out/compare/lm/summary.json ({summary['preset']})"
    return dict(LRS), "LRS in scripts/report/gpu.py (the committed full CPU report's lm grid)"


def lm_runs(sizes, device, data_path, out, deadline, results):
    """One train.py run per model for lm_seconds of training each, where the deadline leaves time for it."""
    data = ["data=text", f"data.path={data_path}"] if data_path else []
    block = f"model.block_size={sizes['lm_block']}"
    cfg = compose(block, *data)
    vocab = load_meta(prepare(cfg.data, sizes["lm_block"]))["vocab_size"]  # once, before the timed runs
    configs = model_pair(sizes, vocab, sizes["lm_block"])
    lrs, source = learning_rates()
    results["lm_settings"] = dict(corpus=Path(data_path).name if data_path else "stdlib", vocab=vocab, lrs=lrs,
                                  lr_source=source, block_size=sizes["lm_block"], batch_size=sizes["lm_batch"],
                                  seconds=sizes["lm_seconds"])
    shapes = {"gpt": [f"model.{key}={value}" for key, value in sizes["gpt"].items()],
              "lstm": ["model=lstm", "model.n_layer=2", f"model.n_embd={configs['lstm'].n_embd}",
                       "model.tie_weights=true"]}
    for name in ("gpt", "lstm"):
        predicted = sizes["lm_seconds"] + sizes["lm_overhead_s"]
        if not deadline.fits(predicted):
            results["skipped"].append(f"lm {name}: predicted {predicted:.0f} s, {deadline.left():.0f} s left")
            continue
        run_dir, lr = out / f"lm-{name}", lrs[name]
        overrides = [*shapes[name], block, *data, f"train.device={device}", "train.dtype=bfloat16",
                     "train.optimizer=adamw", f"train.learning_rate={lr}", f"train.min_lr={lr / 10}",
                     f"train.time_budget_s={sizes['lm_seconds']}", "train.max_iters=1000000",
                     f"train.warmup_iters={sizes['lm_warmup']}", f"train.batch_size={sizes['lm_batch']}",
                     f"train.eval_interval={sizes['lm_eval_interval']}", f"train.eval_iters={sizes['lm_eval_iters']}",
                     "train.checkpoint_interval=1000000", "train.seed=0", f"out_dir={run_dir}"]
        code = train_run(overrides)
        evals = read_metrics(run_dir, "eval") if code == 0 else []
        if not evals:
            results["skipped"].append(f"lm {name}: train.py failed (exit {code}); its error is above")
            continue
        last = evals[-1]
        tokens = last["iter"] * sizes["lm_batch"] * sizes["lm_block"]
        results["lm"].append(dict(model=name, params=build_model(configs[name]).num_params(), lr=lr, steps=last["iter"],
                                  seconds=last["elapsed_s"], tokens=tokens, val_loss=last["val_loss"],
                                  curve=[(r["elapsed_s"], r["val_loss"]) for r in evals]))


def train_run(overrides):
    """`python train.py OVERRIDES` in this working directory; its exit code (its errors print as they come)."""
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides]).returncode


def write(out, results):
    """results.json (everything), results.csv (one measure a row) and gpu.png, from what has been measured so far."""
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    with (out / "results.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["part", "model", "setting", "metric", "value"])
        for r in results["throughput"]:
            writer.writerow(["throughput", r["model"], f"T={r['T']} batch={r['batch']}", "training tokens/s",
                             r["tokens_per_s"]])
        for r in results["lm"]:
            for metric in ("steps", "tokens", "seconds", "val_loss"):
                writer.writerow(["lm", r["model"], f"lr={r['lr']:g}", metric, r[metric]])
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        points = [r for r in results["throughput"] if r["model"] == name]
        a.loglog([r["T"] for r in points], [r["tokens_per_s"] for r in points], "o-", color=color, label=name)
        for r in results["lm"]:
            if r["model"] == name:
                b.plot(*zip(*r["curve"]), "o-", color=color, label=f"{name}, {r['tokens']:,} tokens")
    if results["throughput"]:
        length_axis(a, sorted({r["T"] for r in results["throughput"]}), "sequence length T")
    a.set(ylabel="training tokens / s", title="throughput, bf16 autocast")
    b.set(xlabel="seconds trained", ylabel="val loss", title="equal wall clock (train.py)")
    for ax in (a, b):
        if ax.lines:
            ax.legend(fontsize=8)
    models = " vs ".join(f"{name.upper()} {m['shape']} ({m['params']:,} params)"
                         for name, m in results.get("models", {}).items())
    fig.text(0.01, -0.02, f"{models}, heads tied; {results['sizes']['tokens']:,} tokens per step, median of "
             f"{results['sizes']['rounds']} alternating steps after {results['sizes']['warmup']}; LM runs: "
             f"{results['sizes']['lm_seconds']} s each, AdamW at fixed lrs\n{results['hardware']}; python -m "
             f"scripts.report.gpu{' --smoke' * results['smoke']}; {results['note']}", fontsize=7, color="dimgray",
             va="top")
    fig.savefig(out / "gpu.png", dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/report/gpu", help="where results.json, results.csv and gpu.png go")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, in seconds: the code path only")
    parser.add_argument("--deadline-s", type=float, default=450, help="wall-clock seconds for everything; a part "
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
    lm_runs(sizes, device, args.data_path, out, deadline, results)
    write(out, results)
    for line in results["skipped"]:
        print(f"skipped {line}")
    for r in results["throughput"]:
        print(f"{r['model']:>4} T={r['T']:>5}: {r['tokens_per_s']:>12,} tokens/s ({r['dtype']})")
    for r in results["lm"]:
        print(f"{r['model']:>4} lm: val loss {r['val_loss']:.3f} after {r['steps']:,} steps, {r['tokens']:,} tokens")
    print(f"results in {out}/results.json; {note}")


if __name__ == "__main__":
    main()
