"""The secondary commands, each run from the repository root as `python -m scripts.NAME` (--help says what it does):
evaluate, export, hellaswag, runs, bench, and report (the attention-vs-RNN report, with its committed results)."""
