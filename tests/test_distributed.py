"""Two processes (torchrun, gloo on CPU) train like one: one out_dir, one checkpoint, the same parameters on every
rank, the loss curve of a single process with the same global batch, and an exact resume. Tiny models."""
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from train import train

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# A constant learning rate (no warmup, min_lr = learning_rate), so a 4-step run resumed to 8 steps is a straight 8-step
# run; tokens_per_step = 2 processes x batch_size 4 x block_size 16, so one process takes 2 micro-steps per step.
ARGS = ["data=text", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=16",
        "train.batch_size=4", "train.tokens_per_step=128", "train.warmup_iters=0", "train.learning_rate=1e-3",
        "train.min_lr=1e-3", "train.eval_interval=1000", "train.eval_iters=1", "train.device=cpu",
        "logger.log_interval=1"]
# Observed: 0 (gloo, CPU). Halving is exact in floating point, so averaging 2 processes' gradients equals accumulating
# 2 micro-steps of loss / 2; the tolerance leaves room for other reduction orders.
LOSS_TOLERANCE = 1e-6


def logged(out_dir):
    lines = (Path(out_dir) / "metrics.jsonl").read_text().splitlines()
    return [(r["iter"], r["train_loss"]) for r in map(json.loads, lines) if r["event"] == "log"]


def torchrun(*args):
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_two_processes_train_like_one_with_the_same_global_batch_and_resume(tmp_path):
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away"]
    rng = random.Random(0)
    (tmp_path / "corpus.txt").write_text(" ".join(rng.choice(words) for _ in range(3000)))
    args = [*ARGS, f"data.path={tmp_path / 'corpus.txt'}", f"data.dir={tmp_path / 'prepared'}"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[*args, "train.max_iters=8", f"out_dir={tmp_path / 'one'}"])
        train(OmegaConf.to_object(cfg))  # one process, 2 micro-steps of 4 sequences per step
    finally:
        torch.set_num_threads(threads)

    ddp = tmp_path / "ddp"
    first = torchrun("train.py", *args, "train.max_iters=4", f"out_dir={ddp}")  # the CLI, 2 x 1 micro-step
    assert "2 process(es)" in first and "1 micro-step(s)" in first
    assert sorted(p.name for p in ddp.iterdir()) == [".hydra", "best.pt", "ckpt.pt", "config.json", "loss.png",
                                                    "metrics.jsonl"]  # rank 0 alone writes: one of each
    resumed = torchrun("-m", "tests.ddp_driver", *args, "train.max_iters=8", "train.resume=true", f"out_dir={ddp}")
    assert f"resuming from {ddp / 'ckpt.pt'} at iter 4" in resumed
    digests = dict(re.findall(r"rank (\d) parameter sha256: (\w+)", resumed))
    assert sorted(digests) == ["0", "1"] and digests["0"] == digests["1"]

    one, two = logged(tmp_path / "one"), logged(ddp)
    assert [i for i, _ in two] == [i for i, _ in one] == list(range(1, 9))
    difference = max(abs(a - b) for (_, a), (_, b) in zip(one, two))
    weights = [torch.load(d / "ckpt.pt", weights_only=True)["model"] for d in (tmp_path / "one", ddp)]
    weight_difference = max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0])
    print(f"\nmax |loss(1 process) - loss(2 processes)| = {difference:.2e}, max |weight difference| = "
          f"{weight_difference:.2e}")
    assert difference <= LOSS_TOLERANCE
