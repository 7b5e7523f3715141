"""Compare training runs: a table of the config values that differ between them, iterations, final and best val loss,
bits per byte (when the evals have it), tokens/s and wall time, best val loss first; and one PNG that overlays their
validation curves. Runs that crashed or are still running show as such.

    python -m scripts.runs out/sweep                 # a sweep's out_dir: its job folders 0/, 1/, ... are the runs
    python -m scripts.runs out/a out/b --png ab.png  # any run folders (default PNG: runs.png in the folder they share)

A sweep (python train.py -m ...) prints the same table when it ends and writes runs.png into its out_dir.
Status: finished, running, stopped (a signal), failed (an error), killed (its process is gone), no metrics.
"""
import argparse
from pathlib import Path

from attnlab.compare import compare_runs


def main(argv=None):
    parser = argparse.ArgumentParser(description="Compare training runs: a table, best val loss first, and a PNG of "
                                                 "their validation curves.")
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="a run folder, or a sweep's out_dir")
    parser.add_argument("--png", type=Path, help="where the PNG goes (default: runs.png in the folder the runs share)")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        parser.error(f"not a folder: {', '.join(missing)}")
    compare_runs(args.dirs, args.png)


if __name__ == "__main__":
    main()
