"""The attention-vs-RNN report: `python -m scripts.report` runs its experiments (__main__.PARTS is the schedule).

One file per experiment, each with its budget and, where it decides one of the three reasons, its rule: lm.py,
sizes.py, context.py (reason b), induction.py, mqar.py (c), parallel.py (a; gpu.py on a GPU), and the illustrations
mechanism.py, text.py, cost.py. protocol.py is how every model is tuned, tasks.py what the experiments share (models
of equal size, the synthetic tasks, the one training loop). docs/report.md says the protocol in words.

Each experiment is a function of a Context: it appends rows (ctx.row), every trained grid point (ctx.grid_point), its
verdict by its rule (ctx.verdict), and its figures (ctx.save), each labelled with its models, budget and hardware.
"""
import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import torch

from scripts.timing import hardware_name

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

RESULTS = Path(__file__).resolve().parent / "results"  # the committed reports: quick/ and full/
SCRATCH = Path("out/report")  # where a partial run (--only) writes unless told otherwise (git-ignored)
RUNS = Path("out/report/runs")  # training runs the report makes (git-ignored); later experiments reuse them
REASONS = {  # the three reasons history gives for attention replacing recurrence; each verdict row is about one
    "a": "training runs parallel over the sequence on parallel hardware",
    "b": "better use of long context, and better loss per unit of compute as models and data grow",
    "c": "content-based retrieval (associative recall, induction)",
}
STATUSES = ("shown here", "not shown here", "contradicted here")


@dataclass
class Context:
    preset: str  # quick | full: each experiment's BUDGET[preset] says what it may spend
    device: torch.device
    out: Path  # where figures and tables go
    data_path: str | None = None  # a text file for the language-model experiments (None: the stdlib corpus)
    hardware: str = ""
    text_run: str | None = None  # the run folder whose GPT the text experiment reads (None: the lm experiment's)
    rows: list = field(default_factory=list)
    grid: list = field(default_factory=list)
    verdicts: list = field(default_factory=list)

    def row(self, experiment, measure, gpt, lstm, note="", mingru=""):
        """One line of the results table: the measure for each model (minGRU where the experiment ran it)."""
        self.rows.append(dict(experiment=experiment, measure=measure, gpt=gpt, lstm=lstm, mingru=mingru, note=note))

    def grid_point(self, experiment, model, setting, lr, seed, steps, seconds, metric, value):
        """One trained configuration, kept whether or not it was the best: the whole grid is part of the receipt."""
        self.grid.append(dict(experiment=experiment, model=model, setting=setting, lr=lr, seed=seed, steps=steps,
                              seconds=round(seconds, 1), metric=metric, value=value))

    def verdict(self, experiment, reason, evidence, status, rule=""):
        """What experiment decides about reason (a key of REASONS) by its rule: evidence, the deciding numbers in
        words; status one of STATUSES, optionally followed by " (why)"."""
        if reason not in REASONS or status.split(" (")[0] not in STATUSES:
            raise ValueError(f"reason {reason!r} / status {status!r}: pick from {list(REASONS)} / {STATUSES}")
        self.verdicts.append(dict(experiment=experiment, reason=reason, rule=rule, evidence=evidence, status=status))

    def save(self, fig, name, detail):
        """Every figure carries its models, budget and hardware, so a PNG read alone is still a receipt."""
        fig.text(0.01, -0.02, f"{detail}\n{self.hardware}; python -m scripts.report ({self.preset})", fontsize=7,
                 color="dimgray", va="top")
        fig.savefig(self.out / name, dpi=100, bbox_inches="tight")
        plt.close(fig)


def run_chain(ctx, experiments, threads):
    """Experiments one after another, each on a fresh copy of ctx, in this (worker) process at threads: for each, its
    rows, grid, verdicts, seconds and hardware, which names the thread count it ran with."""
    torch.set_num_threads(threads)
    done = []
    for experiment in experiments:
        part = Context(ctx.preset, ctx.device, ctx.out, ctx.data_path, hardware_name(ctx.device), ctx.text_run)
        t0 = time.time()
        experiment(part)
        done.append((part.rows, part.grid, part.verdicts, time.time() - t0, part.hardware))
    return done
