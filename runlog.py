"""A run's record, written by rank 0: the receipt (config.json), metrics.jsonl, wandb, the progress bar and loss.png.

metrics.jsonl holds one JSON object a line: {"event": "log" | "eval" | "skip", "iter": ..., "elapsed_s": ..., ...}.
"""
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from runtime import git_commit


class RunLog:
    """Rank 0's record of a run: the receipt (config.json), metrics.jsonl, wandb, the progress bar and loss.png.
    On every other rank each call does nothing."""

    def __init__(self, cfg, procs, start_iter):
        self.enabled, self.out_dir, self.wandb = procs.master, Path(cfg.out_dir), None
        self.progress = tqdm(total=cfg.train.max_iters, initial=start_iter, disable=not self.enabled,
                             dynamic_ncols=True, mininterval=1.0, file=sys.stdout)
        if not self.enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        receipt = {"config": asdict(cfg), "argv": sys.argv, "git_commit": git_commit(), "world_size": procs.world_size}
        (self.out_dir / "config.json").write_text(json.dumps(receipt, indent=2))
        metrics_path = self.out_dir / "metrics.jsonl"
        if metrics_path.exists():  # a fresh run starts a new file; a resumed one continues from its checkpoint
            trim_metrics(metrics_path, start_iter if cfg.train.resume else -1)
        self.metrics = metrics_path.open("a")
        if cfg.logger.wandb:
            import wandb  # optional dependency
            self.wandb = wandb.init(project=cfg.logger.wandb_project, config=asdict(cfg), dir=str(self.out_dir),
                                    name=cfg.logger.wandb_run_name or self.out_dir.name, mode=cfg.logger.wandb_mode,
                                    group=cfg.logger.wandb_group)

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
        """Close the files; a wandb run that a signal or an error ended shows as failed."""
        self.progress.close()
        if self.enabled:
            self.metrics.close()
            if self.wandb:
                self.wandb.finish(exit_code=0 if finished else 1)

    def plot(self):
        if self.enabled:
            plot_losses(self.out_dir)


def trim_metrics(path, last_iter):
    """Keep the lines logged up to last_iter: what a killed run logged after its checkpoint goes, and so does a line
    a power cut tore. Rewritten through a temporary file like checkpoints, so a crash here loses nothing either."""
    lines = path.read_text().splitlines()
    kept = [line for line in lines if line.endswith("}") and json.loads(line)["iter"] <= last_iter]  # flat rows
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def read_metrics(out_dir, event):
    """The rows of out_dir/metrics.jsonl for one event (log, eval, skip)."""
    rows = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["event"] == event]


def plot_losses(out_dir):
    import matplotlib  # optional dependency: only the plot needs it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    logs, evals = read_metrics(out_dir, "log"), read_metrics(out_dir, "eval")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["iter"] for r in logs], [r["train_loss"] for r in logs], lw=0.8, alpha=0.6, label="train (batch)")
    ax.plot([r["iter"] for r in evals], [r["val_loss"] for r in evals], "o-", label="val")
    ax.set(xlabel="iteration", ylabel="loss (nats/token)", title=out_dir.name)
    ax.legend()
    fig.savefig(out_dir / "loss.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
