"""A run's record, written by rank 0: the receipt (config.json), status.json, metrics.jsonl, wandb, the progress bar
and loss.png; and the comparison of run folders that scripts/runs.py prints (a sweep prints it too when it ends).

metrics.jsonl holds one JSON object a line: {"event": "log" | "eval" | "skip", "iter": ..., "elapsed_s": ..., ...}.
status.json says how the run stands: {"status": "running" | "finished" | "stopped" | "failed", "pid", "host"}, plus
"error" for a failed one; a run that says running but whose process is gone from this host was killed.
"""
import json
import math
import os
import re
import socket
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

from hydra.experimental.callback import Callback
from tqdm import tqdm

from attnlab.config import flatten
from attnlab.runtime import git_commit

STATUS_FILE = "status.json"
RUN_MARKERS = ("config.json", "metrics.jsonl", STATUS_FILE, ".hydra")  # a sweep job that failed early has .hydra only
# config keys that are bookkeeping, not a difference between runs: the run's folder (the table's run column shows it),
# its wandb names, where a corpus is stored or downloaded from, the vocabulary the corpus sets, whether it resumed
BOOKKEEPING = {"out_dir", "logger.wandb_group", "logger.wandb_run_name", "data.url", "data.dir", "model.vocab_size",
               "train.resume"}
LABEL_CHARS = 24  # a legend value longer than this is cut, so the legend leaves the curves visible


class RunLog:
    """Rank 0's record of a run: the receipt (config.json), status.json, metrics.jsonl, wandb, the progress bar and
    loss.png. On every other rank each call does nothing."""

    def __init__(self, cfg, procs, start_iter, wandb_id=None):
        """wandb_id: the wandb run to continue (a resumed run's); wandb_id then names this run's, None without wandb."""
        self.enabled, self.out_dir, self.wandb, self.wandb_id = procs.master, Path(cfg.out_dir), None, wandb_id
        if self.enabled and cfg.logger.wandb:  # first: a run wandb refuses leaves no half-written record behind
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.wandb = start_wandb(cfg, self.out_dir, wandb_id)
            self.wandb_id = self.wandb.id
        self.progress = tqdm(total=cfg.train.max_iters, initial=start_iter, disable=not self.enabled,
                             dynamic_ncols=True, mininterval=1.0, file=sys.stdout)
        if not self.enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        write_status(self.out_dir, "running")
        receipt = {"config": asdict(cfg), "argv": sys.argv, "git_commit": git_commit(), "world_size": procs.world_size}
        (self.out_dir / "config.json").write_text(json.dumps(receipt, indent=2))
        metrics_path = self.out_dir / "metrics.jsonl"
        if metrics_path.exists():  # a fresh run starts a new file; a resumed one continues from its checkpoint
            trim_metrics(metrics_path, start_iter if cfg.train.resume else -1)
        self.metrics = metrics_path.open("a")

    def print(self, text):
        if self.enabled:
            self.progress.write(text)

    def log(self, event, it, elapsed_s, **values):
        """One row of metrics.jsonl (and wandb); a value of None is left out, as mfu is where the peak is unknown."""
        if not self.enabled:
            return
        row = {"event": event, "iter": it, "elapsed_s": round(elapsed_s, 3),
               **{k: v for k, v in values.items() if v is not None}}
        self.metrics.write(json.dumps(row) + "\n")
        self.metrics.flush()
        if self.wandb:
            self.wandb.log({k: v for k, v in row.items() if k != "event"}, step=it)

    def close(self, finished):
        """Close the files and record how the run ended: failed (an exception is on its way out; train calls this in
        its finally), finished (the loop ran to its end) or stopped (a signal). Only a finished wandb run shows as
        such."""
        self.progress.close()
        if not self.enabled:
            return
        self.metrics.close()
        error = sys.exc_info()[1]
        if error is not None:
            write_status(self.out_dir, "failed", error=f"{type(error).__name__}: {error}".splitlines()[0])
        else:
            write_status(self.out_dir, "finished" if finished else "stopped")
        if self.wandb:
            self.wandb.finish(exit_code=0 if finished and error is None else 1)

    def plot(self):
        if self.enabled:
            plot_losses(self.out_dir)


def start_wandb(cfg, out_dir, wandb_id):
    """The wandb run to log to: wandb_id's (a resumed run's) or a new one. A logger key left None leaves the choice
    to wandb's own settings (WANDB_MODE, WANDB_PROJECT, WANDB_NAME, WANDB_RUN_GROUP, WANDB_DIR, `wandb login`), as
    for any wandb user; a key the config sets wins. A run wandb refuses (no API key, a refused key, no server) is a
    ValueError naming the fix."""
    import wandb  # optional dependency
    logger = cfg.logger
    wandb_dir = None if os.environ.get("WANDB_DIR") else str(out_dir)  # None: wandb reads WANDB_DIR
    try:
        return wandb.init(project=logger.wandb_project or os.environ.get("WANDB_PROJECT") or "attnlab",
                          name=logger.wandb_run_name or os.environ.get("WANDB_NAME") or out_dir.name,
                          group=logger.wandb_group, mode=logger.wandb_mode, dir=wandb_dir, config=asdict(cfg),
                          id=wandb_id, resume="allow")
    except wandb.errors.Error as e:
        reason = (str(e) or type(e).__name__).splitlines()[0]
        raise ValueError(f"wandb could not start a run ({reason}), so nothing was trained or recorded in {out_dir}; "
                         f"run `wandb login`, or log to disk only with WANDB_MODE=offline (or "
                         f"logger.wandb_mode=offline) and upload later with `wandb sync`") from e


def write_status(out_dir, status, **details):
    """out_dir/status.json, replaced whole so that a reader never sees half of it."""
    tmp = out_dir / "status.tmp"
    tmp.write_text(json.dumps({"status": status, "pid": os.getpid(), "host": socket.gethostname(), **details}))
    os.replace(tmp, out_dir / STATUS_FILE)


def run_status(run_dir):
    """The run's status.json status (None without one), "killed" for a running one whose process is gone. A run on
    another host is taken at its word."""
    path = Path(run_dir) / STATUS_FILE
    if not path.exists():
        return None
    status = json.loads(path.read_text())
    if status["status"] == "running" and status["host"] == socket.gethostname() and not process_alive(status["pid"]):
        return "killed"
    return status["status"]


def process_alive(pid):
    try:
        os.kill(pid, 0)  # signal 0 checks that the process exists and sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def trim_metrics(path, last_iter):
    """Keep the lines logged up to last_iter: what a killed run logged after its checkpoint goes, and so does a line
    a power cut tore. Rewritten through a temporary file like checkpoints, so a crash here loses nothing either."""
    lines = path.read_text().splitlines()
    kept = [line for line in lines if line.endswith("}") and json.loads(line)["iter"] <= last_iter]  # flat rows
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def metrics_rows(out_dir):
    """Every row of out_dir/metrics.jsonl; a line that a crash (or the writer, right now) left half-written is left
    out, as trim_metrics drops it."""
    lines = (Path(out_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]  # flat rows: "}" ends only a whole one


def read_metrics(out_dir, event):
    """The rows of out_dir/metrics.jsonl for one event (log, eval, skip)."""
    return [r for r in metrics_rows(out_dir) if r["event"] == event]


def plot_losses(out_dir):
    plt = pyplot()
    logs, evals = read_metrics(out_dir, "log"), read_metrics(out_dir, "eval")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["iter"] for r in logs], [r["train_loss"] for r in logs], lw=0.8, alpha=0.6, label="train (batch)")
    ax.plot([r["iter"] for r in evals], [r["val_loss"] for r in evals], "o-", label="val")
    ax.set(xlabel="iteration", ylabel="loss (nats/token)", title=out_dir.name)
    ax.legend()
    fig.savefig(out_dir / "loss.png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def pyplot():
    import matplotlib  # optional dependency: only the plots need it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# Comparing runs (scripts/runs.py, SweepSummary): each run folder becomes one row dict (summarize), the rows one table.

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
