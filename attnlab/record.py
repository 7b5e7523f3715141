"""A run's record, written by rank 0: the receipt (config.json), status.json, metrics.jsonl, wandb, the progress bar
and loss.png. Comparing run folders (the runs table) is attnlab/compare.py.

metrics.jsonl holds one JSON object a line: {"event": "log" | "eval" | "skip", "iter": ..., "elapsed_s": ..., ...}.
status.json says how the run stands: {"status": "running" | "finished" | "stopped" | "failed", "pid", "host"}, plus
"error" for a failed one; a run that says running but whose process is gone from this host was killed.
"""
import json
import os
import socket
import sys
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from attnlab.runtime import git_commit

STATUS_FILE = "status.json"


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
    except ValueError as e:  # wandb's settings, validated by pydantic: a WANDB_* variable or a logger key it refuses
        fields = [line.strip() for line in str(e).splitlines()[1:3]]
        raise ValueError(f"wandb refused its settings ({': '.join(fields)}); fix that WANDB_* environment variable or "
                         f"logger.wandb_* key, or set logger.wandb=false") from e
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
