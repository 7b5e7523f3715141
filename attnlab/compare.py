"""Comparing run folders: each run becomes one row (summarize), the rows one Markdown table, best first
(runs_table), and one PNG of their validation curves. scripts/runs.py prints them; a sweep prints them when it ends
(SweepSummary, which configs/config.yaml registers).

    python -m scripts.runs out/sweep
"""
import json
import math
import os
import re
import statistics
import time
from pathlib import Path

from hydra.experimental.callback import Callback

from attnlab.config import flatten
from attnlab.record import STATUS_FILE, metrics_rows, pyplot, run_status

RUN_MARKERS = ("config.json", "metrics.jsonl", STATUS_FILE, ".hydra")  # a sweep job that failed early has .hydra only
# config keys that are bookkeeping, not a difference between runs: the run's folder (the table's run column shows it),
# its wandb names, where a corpus is stored or downloaded from, the vocabulary the corpus sets, whether it resumed
BOOKKEEPING = {"out_dir", "logger.wandb_group", "logger.wandb_run_name", "data.url", "data.dir", "model.vocab_size",
               "train.resume"}
LABEL_CHARS = 24  # a legend value longer than this is cut, so the legend leaves the curves visible


def find_runs(paths):
    """The run folders that paths name: a path that is a run, and the runs below it (a sweep's job folders, in the
    order of their numbers); a path that holds neither shows as a run without metrics."""
    found = []
    for path in map(Path, paths):
        here = [path] if is_run(path) else []
        found += here + runs_below(path) or [path]
    return list({p.resolve(): p for p in found}.values())  # a run named twice (a sweep and one of its jobs) once


def is_run(folder):
    return any((folder / marker).exists() for marker in RUN_MARKERS)


def runs_below(folder):
    children = sorted((d for d in folder.iterdir() if d.is_dir() and not d.name.startswith(".")),
                      key=lambda d: [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", d.name)])
    return [run for d in children for run in ([d] if is_run(d) else runs_below(d))]


def summarize(run_dir):
    """One run as a row: its status, its config flattened to dotted keys, its figures (None where it has none) and
    its validation curve [(iter, val_loss), ...]."""
    run_dir = Path(run_dir)
    rows = metrics_rows(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    evals = [r for r in rows if r["event"] == "eval"]
    speeds = [r["tokens_per_sec"] for r in rows if r["event"] == "log"]
    bpb = [r["val_bpb"] for r in evals if "val_bpb" in r]
    receipt = run_dir / "config.json"
    return {"run_dir": run_dir,
            "status": run_status(run_dir) or ("unknown" if rows else "no metrics"),  # unknown: older than status.json
            "config": flatten(json.loads(receipt.read_text())["config"]) if receipt.exists() else {},
            "iters": rows[-1]["iter"] if rows else None,
            "final_val_loss": evals[-1]["val_loss"] if evals else None,
            "best_val_loss": min((r["val_loss"] for r in evals if math.isfinite(r["val_loss"])), default=None),
            "val_bpb": bpb[-1] if bpb else None,
            "tokens_per_sec": statistics.median(speeds) if speeds else None,
            "wall_s": rows[-1]["elapsed_s"] if rows else None,
            "val_curve": [(r["iter"], r["val_loss"]) for r in evals]}


def differing_keys(rows):
    """The config keys whose values differ between the runs that have a config, in the config's order."""
    configs = [row["config"] for row in rows if row["config"]]
    keys = dict.fromkeys(key for config in configs for key in config)
    return [key for key in keys
            if key not in BOOKKEEPING and len({json.dumps(config.get(key)) for config in configs}) > 1]


def ranked(rows):
    """(name, row) pairs, the lowest final val loss first and runs without a finite one last; a name is the run's
    folder relative to the folder that all the runs share."""
    shared = shared_folder(rows)
    pairs = [(str(row["run_dir"].resolve().relative_to(shared)), row) for row in rows]

    def val_loss(pair):
        loss = pair[1]["final_val_loss"]
        return (0, loss) if loss is not None and math.isfinite(loss) else (1, 0.0)
    return sorted(pairs, key=val_loss)


def shared_folder(rows):
    """The folder that holds every run: a sweep's out_dir for its jobs, the parent of a lone run."""
    folders = [row["run_dir"].resolve() for row in rows]
    shared = Path(os.path.commonpath(folders))
    return shared.parent if shared in folders else shared


def runs_table(rows):
    """A Markdown table of the runs, best first: status, the config values that differ, iterations, final and best
    val loss, bits per byte (where the evals have it), median tokens/s and wall time."""
    keys = differing_keys(rows)
    figures = [(key, title, form) for key, title, form in FIGURES
               if key != "val_bpb" or any(row["val_bpb"] is not None for row in rows)]
    header = ["run", "status", *keys, *(title for _, title, _ in figures)]
    body = [[name, row["status"], *(config_value(row["config"], key) for key in keys),
             *("-" if row[key] is None else form(row[key]) for key, _, form in figures)]
            for name, row in ranked(rows)]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    left = 2 + len(keys)  # names and config values read left-aligned, figures right-aligned

    def aligned(line):
        return [cell.ljust(w) if i < left else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))]
    rule = [":" + "-" * (w - 1) if i < left else "-" * (w - 1) + ":" for i, w in enumerate(widths)]
    return "\n".join("| " + " | ".join(line) + " |" for line in [aligned(header), rule, *map(aligned, body)])


def config_value(config, key):
    """A config value as an override spells it (null, true, 0.001); "-" where the run has no such key."""
    if key not in config:
        return "-"
    value = config[key]
    if isinstance(value, float):  # short where that loses nothing: 1e+10, not 10000000000.0
        return f"{value:g}" if float(f"{value:g}") == value else repr(value)
    return value if isinstance(value, str) else json.dumps(value)


def short_value(config, key):
    """A legend's spelling of a value: a path by its last part, anything longer than LABEL_CHARS cut."""
    value = config_value(config, key)
    if "/" in value:
        value = Path(value).name
    return value if len(value) <= LABEL_CHARS else value[:LABEL_CHARS - 1] + "…"


def duration(seconds):
    minutes, secs = divmod(round(seconds), 60)
    if minutes == 0:
        return f"{seconds:.1f} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


# the table's figures: (row key, column title, how a value reads)
FIGURES = [("iters", "iters", str), ("final_val_loss", "final val loss", "{:.4f}".format),
           ("best_val_loss", "best val loss", "{:.4f}".format), ("val_bpb", "val bpb", "{:.4f}".format),
           ("tokens_per_sec", "tokens/s", "{:,.0f}".format), ("wall_s", "wall time", duration)]


def plot_val_curves(rows, path):
    """One PNG at path overlaying the runs' validation-loss curves in the table's order, each labelled by the config
    values that differ (short), or by its name where none do. Returns False (and writes nothing) when no run has an
    eval."""
    if not any(row["val_curve"] for row in rows):
        return False
    plt = pyplot()
    keys = differing_keys(rows)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, row in ranked(rows):
        if row["val_curve"]:
            iters, losses = zip(*row["val_curve"])
            values = [f"{key.split('.')[-1]}={short_value(row['config'], key)}" for key in keys if row["config"]]
            label = ", ".join(values) or name
            ended = "" if row["status"] == "finished" else f" ({row['status']})"
            ax.plot(iters, losses, "o-", ms=3, label=label + ended)
    ax.set(xlabel="iteration", ylabel="val loss (nats/token)",
           title=f"validation loss of the runs in {shared_folder(rows).name}/")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(0, -0.13))  # below: long labels hide no curve
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


def compare_runs(paths, png=None, runs=None):
    """Print the table of the runs that paths name (or of the run folders `runs`, when given) and write the PNG of
    their validation curves (default: runs.png in the one folder given, else in the folder the paths share)."""
    rows = [summarize(folder) for folder in (runs if runs is not None else find_runs(paths))]
    print(runs_table(rows))
    png = Path(png) if png else Path(os.path.commonpath([Path(p).resolve() for p in paths])) / "runs.png"
    if plot_val_curves(rows, png):
        print(f"validation curves: {png}")


def started_at(run):
    """When a run folder was begun: Hydra writes a job's .hydra/ first."""
    marker = run / ".hydra"
    return (marker if marker.exists() else run).stat().st_mtime


class SweepSummary(Callback):
    """Hydra calls this when a sweep (train.py -m) ends (configs/config.yaml registers it): the table of this sweep's
    jobs, the job folders written since it started, and <out_dir>/runs.png; an earlier run in the folder is named
    apart, not mixed in."""

    def on_multirun_start(self, config, **kwargs):
        self.started = time.time()

    def on_multirun_end(self, config, **kwargs):
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = [run for run in runs_below(sweep_dir) if started_at(run) >= self.started - 1]  # 1 s: coarse clocks
        if is_run(sweep_dir):
            print(f"{sweep_dir} also holds an earlier run, left out of this table (python -m scripts.runs "
                  f"{sweep_dir} lists it too)")
        if jobs:
            compare_runs([sweep_dir], sweep_dir / "runs.png", runs=jobs)
