"""Why attention replaced RNNs, measured here: a GPT against an LSTM and a minGRU of its size, in one command.

    python -m scripts.report                    # quick preset: results/quick/
    python -m scripts.report --full             # longer caps, more pairs, wider models: scripts/report/results/full/
    python -m scripts.report --full --jobs 2    # the untimed parts two at a time, one thread each
    python -m scripts.report --only mqar        # one experiment (or several, comma-separated): into out/report/quick/
    python -m scripts.report --only mqar --out scripts/report/results/quick     # ... into the committed report
    python -m scripts.report --only lm --data-path tinyshakespeare.txt  # a real corpus of your own
    python train.py && python -m scripts.report --only text --text-run out  # the default GPT's heads on real code

Each run rewrites its experiments' rows of results.csv (the table to read first) and grid.csv (every trained
configuration of every grid), keeping other experiments' rows, then results.md and one PNG per figure. Seeds are
fixed; figures name model sizes, steps and hardware. The experiments live in scripts/report/; docs/attention.md walks
through the mechanism behind each figure.
"""
import argparse
import csv
import json
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from attnlab.cli import at_least
from attnlab.runtime import pick_device
from scripts.report import REASONS, RESULTS, SCRATCH, STATUSES, Context, run_chain
from scripts.report.context import exp_context
from scripts.report.cost import exp_generation, exp_long
from scripts.report.induction import exp_induction
from scripts.report.lm import cached_lm, exp_lm
from scripts.report.mechanism import exp_paths, exp_scaling
from scripts.report.mqar import exp_mqar
from scripts.report.parallel import exp_parallel
from scripts.report.sizes import cached_sizes, exp_sizes
from scripts.report.text import exp_text
from scripts.timing import hardware_name


@dataclass(frozen=True)
class Part:
    """One experiment of the schedule: its function, whether its numbers are wall times (then it runs alone, even
    with --jobs), and which experiment's runs it reads, lm or sizes (which are then trained first)."""
    run: Callable
    timed: bool = False
    reads: str | None = None


# the schedule, in the tables' order; with --jobs the untimed parts go to the pool in this order
PARTS = dict(
    scaling=Part(exp_scaling),
    induction=Part(exp_induction),
    mqar=Part(exp_mqar),
    lm=Part(exp_lm, timed=True),
    sizes=Part(exp_sizes),
    context=Part(exp_context, reads="sizes"),
    text=Part(exp_text, reads="lm"),
    paths=Part(exp_paths, reads="lm"),
    parallel=Part(exp_parallel, timed=True),
    long=Part(exp_long, timed=True),
    generation=Part(exp_generation, timed=True),
)
RESULT_FIELDS = ["experiment", "measure", "gpt", "lstm", "mingru", "note"]
GRID_FIELDS = ["experiment", "model", "setting", "lr", "seed", "steps", "seconds", "metric", "value"]
VERDICT_FIELDS = ["experiment", "reason", "rule", "evidence", "status"]  # Context.verdict's rows; statuses: STATUSES


def merge_csv(path, fields, new_rows, replaced):
    """path's rows of experiments not in replaced, then new_rows, in PARTS order (stable within each)."""
    old = list(csv.DictReader(path.open())) if path.exists() else []
    rows = sorted([r for r in old if r["experiment"] not in replaced] + new_rows,
                  key=lambda r: list(PARTS).index(r["experiment"]))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)
    return rows


def verdict_table(verdicts):
    """One row per reason: every experiment's deciding number, and the verdict, which is the experiments' common
    status, or each experiment's own when they disagree (a reason no experiment ran on is said so)."""
    lines = ["| reason attention replaced RNNs | the rule, written before the run | the deciding numbers | verdict |",
             "|---|---|---|---|"]
    for key, reason in REASONS.items():
        found = [v for v in verdicts if v["reason"] == key]  # in PARTS order, as merge_csv sorts
        rules = "; ".join(f"{v['experiment']}: {v['rule']}" for v in found if v.get("rule")) or "-"
        evidence = "; ".join(f"{v['experiment']}: {v['evidence']}" for v in found) or "no experiment of this run"
        statuses = {v["status"] for v in found}
        status = (next(iter(statuses)) if len(statuses) == 1 else
                  "; ".join(f"{v['status']} ({v['experiment']})" for v in found) if found else "not run")
        lines.append(f"| ({key}) {reason} | {rules} | {evidence} | **{status}** |")
    return lines


def write_report(ctx, ran, seconds, hardware=None):
    """Merge this run's rows into results.csv (keeping other experiments' rows), then rewrite results.md, which opens
    with the verdict on the three reasons. hardware: each part's, where it differs from ctx.hardware (--jobs)."""
    csv_path, runs_path = ctx.out / "results.csv", ctx.out / "runs.json"
    replaced = set(ran)
    rows = merge_csv(csv_path, RESULT_FIELDS, ctx.rows, replaced)
    merge_csv(ctx.out / "grid.csv", GRID_FIELDS, ctx.grid, replaced)
    verdicts = merge_csv(ctx.out / "verdicts.csv", VERDICT_FIELDS, ctx.verdicts, replaced)
    runs = json.loads(runs_path.read_text()) if runs_path.exists() else {}
    for name in ran:
        runs[name] = dict(seconds=round(seconds[name]), preset=ctx.preset,
                          hardware=(hardware or {}).get(name, ctx.hardware), torch=torch.__version__,
                          date=time.strftime("%Y-%m-%d"))
    runs_path.write_text(json.dumps(runs, indent=1) + "\n")
    table = ["| experiment | measure | GPT (attention) | LSTM (recurrence) | minGRU (parallel recurrence) | note |",
             "|---|---|---|---|---|---|"]
    table += [f"| {r['experiment']} | {r['measure']} | {r['gpt']} | {r['lstm']} | {r.get('mingru') or ''} | "
              f"{r['note']} |" for r in rows]
    lines = ["# Attention vs recurrence, measured", "",
             "Written by `python -m scripts.report`; every number below comes from the run listed under it. "
             f"A verdict is one of: {', '.join(STATUSES)}, chosen by each experiment's code from its numbers.", "",
             *verdict_table(verdicts), "", *table, "",
             "| experiment | preset | wall time | hardware | torch | date |", "|---|---|---|---|---|---|",
             *[f"| {n} | {r['preset']} | {r['seconds']} s | {r['hardware']} | {r['torch']} | {r['date']} |"
               for n, r in sorted(runs.items(), key=lambda kv: list(PARTS).index(kv[0]))],
             "", "Figures: " + ", ".join(f"[{p.name}]({p.name})" for p in sorted(ctx.out.glob("*.png"))),
             "Complexity table by sequence length: [paths.md](paths.md)." if (ctx.out / "paths.md").exists() else ""]
    (ctx.out / "results.md").write_text("\n".join(lines).rstrip() + "\n")
    print("\n".join(verdict_table(verdicts) + [""] + table))


def run_parts(ctx, names, jobs):
    """Every experiment of names, in PARTS order, or with jobs > 1: the timed experiments others read (lm) alone,
    then the untimed parts jobs at a time in worker processes (spawned: a forked OpenMP runtime can hang), each on its
    share of the threads, an untimed experiment others read (sizes) first and its readers after it in its worker,
    then the other timed parts alone. A part that reads the lm or sizes runs where they are not there brings that
    experiment in, so its rows, grid and verdict are written with the runs. Returns each part's seconds (every part
    run) and, for the pooled ones, their hardware."""
    seconds, hardware = {}, {}
    def alone(name):
        t0 = time.time()
        PARTS[name].run(ctx)
        seconds[name] = time.time() - t0
        tqdm.write(f"{name}: {seconds[name]:.0f} s")
    for source, there in (("lm", cached_lm), ("sizes", cached_sizes)):
        # text may read another run's GPT
        readers = [n for n in names if PARTS[n].reads == source and not (n == "text" and ctx.text_run)]
        if readers and source not in names and there(ctx) is None:
            tqdm.write(f"{', '.join(readers)} read the {source} runs, not there for the {ctx.preset} preset yet: "
                       f"{source} runs first")
            names = [*names, source]
    names = sorted(names, key=list(PARTS).index)
    if jobs == 1:
        for name in (bar := tqdm(names, desc="report", unit="experiment")):
            bar.set_postfix_str(name)
            alone(name)
        return seconds, hardware
    read = [n for n in names if any(PARTS[r].reads == n for r in names)]
    for name in read:
        if PARTS[name].timed:
            alone(name)  # first, so that no worker reads runs another is training
    # a worker runs an untimed source, then its readers; these chains go first, then every other untimed part
    chains = [[n, *(r for r in names if PARTS[r].reads == n)] for n in read if not PARTS[n].timed]
    chains += [[n] for n in names if not PARTS[n].timed and not any(n in chain for chain in chains)]
    threads = max(1, torch.get_num_threads() // jobs)
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_chain, ctx, [PARTS[n].run for n in chain], threads): chain for chain in chains}
        for future in as_completed(futures):
            for name, (rows, grid, verdicts, s, hw) in zip(futures[future], future.result()):
                ctx.rows += rows
                ctx.grid += grid
                ctx.verdicts += verdicts
                seconds[name], hardware[name] = s, hw
                tqdm.write(f"{name}: {s:.0f} s ({hw.rsplit(', ', 1)[-1]}, {jobs} parts at a time)")
    for name in names:
        if PARTS[name].timed and name not in seconds:
            alone(name)
    return seconds, hardware


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the stated budgets instead of the quick preset")
    parser.add_argument("--only", help=f"comma-separated experiments out of: {', '.join(PARTS)}")
    parser.add_argument("--data-path", help="a UTF-8 text file for the lm experiment (default: the stdlib corpus)")
    parser.add_argument("--text-run", help="a train.py run folder (a char-level GPT on the stdlib corpus) whose "
                        "attention the text experiment reads, e.g. out after `python train.py`; default: the lm "
                        "experiment's GPT")
    parser.add_argument("--out", help="where figures and tables go (default: scripts/report/results/quick, with --full "
                        "scripts/report/results/full; with --only out/report/quick or out/report/full)")
    parser.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu) | cpu | cuda")
    parser.add_argument("--threads", type=at_least(0), default=0, help="CPU threads for PyTorch; 0 keeps its default")
    parser.add_argument("--jobs", type=at_least(1), default=1, help="parts run at a time, each on threads/jobs "
                        "threads (the timed parts always run alone): small models train faster side by side")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(PARTS)
    if unknown := set(names) - set(PARTS):
        parser.error(f"unknown experiment(s) {', '.join(sorted(unknown))}; pick from {', '.join(PARTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        device = pick_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    preset = "full" if args.full else "quick"
    # a partial run (--only) leaves the committed report alone unless --out names it
    out = Path(args.out) if args.out else (SCRATCH if args.only else RESULTS) / preset
    ctx = Context(preset, device, out, args.data_path, hardware_name(device), args.text_run)
    ctx.out.mkdir(parents=True, exist_ok=True)
    print(f"report ({preset}) on {ctx.hardware}: {', '.join(names)}")
    start = time.time()
    seconds, hardware = run_parts(ctx, names, args.jobs)
    write_report(ctx, list(seconds), seconds, hardware)
    print(f"total {time.time() - start:.0f} s; results in {ctx.out}/results.md")


if __name__ == "__main__":
    main()
