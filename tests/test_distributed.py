"""Two processes (torchrun, gloo on CPU) train like one: one out_dir, one checkpoint, the same parameters on every
rank, the losses and weights of a single process with the same global batch, and an exact resume. Tiny models."""
import json
import re

import pytest
import torch

from conftest import compose, data_overrides, run_script
from runlog import read_metrics
from train import train

# A constant learning rate (no warmup, min_lr = learning_rate), so a 4-step run resumed to 8 steps is a straight 8-step
# run; tokens_per_step = 2 processes x batch_size 4 x block_size 16, so one process takes 2 micro-steps per step.
ARGS = ["data=text", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=16",
        "train.batch_size=4", "train.tokens_per_step=128", "train.warmup_iters=0", "train.learning_rate=1e-3",
        "train.min_lr=1e-3", "train.eval_interval=1000", "train.eval_iters=1", "train.device=cpu",
        "logger.log_interval=1"]
# Observed: 0 for both (gloo, CPU). Halving is exact in floating point, so averaging 2 processes' gradients equals
# accumulating 2 micro-steps of loss / 2; the tolerances leave room for other reduction orders. The weights' is an
# absolute difference after 8 AdamW steps of lr 1e-3: a diverging run would differ by ~1e-3 per step.
LOSS_TOLERANCE = 1e-6
WEIGHT_TOLERANCE = 1e-6


def torchrun(*args):
    result = run_script("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_two_processes_train_like_one_with_the_same_global_batch_and_resume(tmp_path, one_thread):
    args = [*ARGS, *data_overrides(tmp_path)]
    train(compose(*args, "train.max_iters=8", f"out_dir={tmp_path / 'one'}"))  # one process, 2 micro-steps of 4

    ddp = tmp_path / "ddp"
    first = torchrun("train.py", *args, "train.max_iters=4", f"out_dir={ddp}")  # the CLI, 2 x 1 micro-step
    assert "2 process(es)" in first and "1 micro-step(s)" in first
    assert sorted(p.name for p in ddp.iterdir()) == [".hydra", "best.pt", "ckpt.pt", "config.json", "loss.png",
                                                    "metrics.jsonl", "status.json"]  # rank 0 alone writes: one of each
    assert json.loads((ddp / "status.json").read_text())["status"] == "finished"
    resumed = torchrun("-m", "tests.ddp_driver", *args, "train.max_iters=8", "train.resume=true", f"out_dir={ddp}")
    assert f"resuming from {ddp / 'ckpt.pt'} at iter 4" in resumed
    digests = dict(re.findall(r"rank (\d) parameter sha256: (\w+)", resumed))
    assert sorted(digests) == ["0", "1"] and digests["0"] == digests["1"]

    one, two = read_metrics(tmp_path / "one", "log"), read_metrics(ddp, "log")
    assert [r["iter"] for r in two] == [r["iter"] for r in one] == list(range(1, 9))
    loss_difference = max(abs(a["train_loss"] - b["train_loss"]) for a, b in zip(one, two))
    weights = [torch.load(d / "ckpt.pt", weights_only=True)["model"] for d in (tmp_path / "one", ddp)]
    assert weights[0].keys() == weights[1].keys()
    weight_difference = max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0])
    print(f"\nmax |loss(1 process) - loss(2 processes)| = {loss_difference:.2e}, max |weight difference| = "
          f"{weight_difference:.2e}")
    assert loss_difference <= LOSS_TOLERANCE
    assert weight_difference <= WEIGHT_TOLERANCE
