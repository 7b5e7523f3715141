"""Crash safety: SIGKILL at many moments then resume, SIGINT/SIGTERM, non-finite losses. CPU, tiny models.

The kill test runs the real CLI (`python train.py ...`) in subprocesses and compares with a straight run of train().
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import train as train_module
from conftest import REPO, TINY, compose, data_overrides, run_script
from model import GPT
from attnlab.record import read_metrics
from train import train

UNBUFFERED = {"PYTHONUNBUFFERED": "1"}  # every line is in the log at once, for the harness that polls it
# conftest's TINY as these runs were tuned: 64 wide, evaluated every 10 steps, a log line per step (the harness polls)
CRASH = [*TINY, "model.n_embd=64", "train.eval_iters=2", "train.eval_interval=10", "train.warmup_iters=5",
         "logger.log_interval=1"]


def last_logged(out_dir):
    """The iteration of the last "log" line (0 if none), read from the end of metrics.jsonl: the harness polls it."""
    try:
        tail = (Path(out_dir) / "metrics.jsonl").read_bytes()[-4096:].splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(tail):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # cut by the 4096 bytes, or being written
            continue
        if row["event"] == "log":
            return row["iter"]
    return 0


def written_since(path, since_ns):
    try:
        return path.stat().st_mtime_ns >= since_ns
    except FileNotFoundError:
        return False


def start(args, log_file):
    with log_file.open("w") as log:  # the child writes through its own copy of the file descriptor
        return subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO, env={**os.environ, **UNBUFFERED},
                                stdout=log, stderr=subprocess.STDOUT)


def wait_for(proc, log_file, condition, timeout=120):
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"train.py exited ({proc.returncode}) before the kill point:\n{log_file.read_text()[-2000:]}")
        if time.time() > deadline:
            pytest.fail(f"no kill point within {timeout} s:\n{log_file.read_text()[-2000:]}")
        time.sleep(0.001)


def fresh_write(out_dir, since_ns):
    """A checkpoint being written right now: a temporary file this process created and has not yet renamed."""
    return written_since(out_dir / "ckpt.tmp", since_ns) or written_since(out_dir / "best.tmp", since_ns)


def run_chain(args, out_dir, kinds, seed):
    """Start train.py, SIGKILL it at the moment each kind names, resume, ...; then let it finish.
    Returns one (kind, checkpoint iter after the kill, killed mid-write) per kill."""
    rng = random.Random(seed)
    ckpt_path, kills = out_dir / "ckpt.pt", []
    for n, kind in enumerate(kinds):
        before = torch.load(ckpt_path, weights_only=True)["iter"] if ckpt_path.exists() else 0
        log_file = out_dir.parent / f"{out_dir.name}-{n}.log"
        since_ns = time.time_ns()
        proc = start([*args, f"train.resume={ckpt_path.exists()}"], log_file)
        metrics = out_dir / "metrics.jsonl"  # until this process writes to it, it holds the killed run's lines
        try:
            if kind == "start":  # just after start-up: trimming metrics, the first evaluation, the first step
                wait_for(proc, log_file, lambda: "micro-step(s)" in log_file.read_text())
                time.sleep(rng.uniform(0, 0.05))
            elif kind == "steps":  # anywhere in the loop, a few steps on
                target = before + rng.randint(1, 6)
                wait_for(proc, log_file, lambda: written_since(metrics, since_ns) and last_logged(out_dir) >= target)
                time.sleep(rng.uniform(0, 0.02))
            else:  # "write": at once while ckpt.tmp or best.tmp is being written or fsynced, before its rename
                target = before + rng.randint(0, 4)
                wait_for(proc, log_file, lambda: fresh_write(out_dir, since_ns) and written_since(metrics, since_ns)
                         and last_logged(out_dir) >= target)
        finally:
            proc.kill()
            proc.wait()
        resumed = re.search(r"resuming from .* at iter (\d+)", log_file.read_text())
        assert resumed is None or int(resumed[1]) == before
        mid_write = fresh_write(out_dir, since_ns)
        after = 0
        if ckpt_path.exists():
            after = torch.load(ckpt_path, weights_only=True)["iter"]  # loads: never a torn file
            assert before <= after and last_logged(out_dir) - 1 <= after <= last_logged(out_dir)
        kills.append((kind, after, mid_write))
    finish = run_script("train.py", *args, f"train.resume={ckpt_path.exists()}", env=UNBUFFERED, timeout=300)
    assert finish.returncode == 0, finish.stdout[-2000:] + finish.stderr
    return kills


@pytest.mark.slow
def test_sigkill_anywhere_then_resume_gives_the_losses_of_a_straight_run(tmp_path, one_thread):
    args = [*CRASH, *data_overrides(tmp_path), "train.max_iters=120", "train.checkpoint_interval=1"]
    train(compose(*args, f"out_dir={tmp_path / 'straight'}"))
    kinds = ["write", "steps", "start", "write", "steps", "write", "start", "steps", "write", "steps", "write", "start"]
    with ThreadPoolExecutor(2) as pool:  # two killed runs side by side: one per core, half the wall time
        chains = [pool.submit(run_chain, [*args, f"out_dir={tmp_path / name}"], tmp_path / name, kinds, seed)
                  for seed, name in enumerate(["killed-a", "killed-b"])]
        kills = [kill for chain in chains for kill in chain.result()]

    straight = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=True)
    for name in ("killed-a", "killed-b"):
        for event, keys in (("log", ("iter", "train_loss")), ("eval", ("iter", "train_loss", "val_loss"))):
            assert [[r[k] for k in keys] for r in read_metrics(tmp_path / name, event)] == \
                   [[r[k] for k in keys] for r in read_metrics(tmp_path / "straight", event)]
        resumed = torch.load(tmp_path / name / "ckpt.pt", weights_only=True)
        assert all(torch.equal(resumed["model"][k], v) for k, v in straight["model"].items())
    mid_write = sum(m for _, _, m in kills)
    print(f"\n{len(kills)} SIGKILLs survived, {mid_write} of them while a checkpoint was being written: {kills}")
    assert len(kills) == 24 and mid_write >= 5


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_a_signal_saves_a_checkpoint_says_where_and_exits_nonzero(tmp_path, signum):
    out_dir = tmp_path / "run"
    log_file = tmp_path / "train.log"
    proc = start([*CRASH, *data_overrides(tmp_path), f"out_dir={out_dir}", "train.max_iters=100000"], log_file)
    try:
        wait_for(proc, log_file, lambda: last_logged(out_dir) >= 3)
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 128 + signum
    finally:
        proc.kill()
    ckpt = torch.load(out_dir / "ckpt.pt", weights_only=True)
    assert f"stopped by signal {signum} at iter {ckpt['iter']}; checkpoint saved to {out_dir / 'ckpt.pt'}; " \
           f"continue with train.resume=true out_dir={out_dir}" in log_file.read_text()
    assert ckpt["iter"] == last_logged(out_dir)  # every finished step is in it


def test_a_nonfinite_loss_stops_the_run_naming_the_iteration_and_keeps_the_checkpoint(tmp_path, one_thread):
    out_dir = tmp_path / "run"
    cfg = compose(*CRASH, *data_overrides(tmp_path), f"out_dir={out_dir}", "train.max_iters=20",
                  "train.checkpoint_interval=1", "train.warmup_iters=0", "train.learning_rate=1e10",
                  "train.grad_clip=0", "train.optimizer=adamw", "model.norm=layernorm", "model.mlp=gelu",
                  "model.qk_norm=false")  # GPT-2's blocks under AdamW at lr 1e10: the loss overflows before a weight
    with pytest.raises(ValueError, match=r"the loss is nan at iter (\d+); stopped before its optimizer step, .*"
                                         r"train.skip_nonfinite=true") as error:
        train(cfg)
    bad_iter = int(str(error.value).split("at iter ")[1].split(";")[0])
    ckpt = torch.load(out_dir / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == bad_iter and all(v.isfinite().all() for v in ckpt["model"].values())
    assert last_logged(out_dir) == bad_iter and not (out_dir / "ckpt.tmp").exists()


class NanAt(GPT):
    """A GPT whose training loss is nan on chosen forward calls, as a corrupted batch would make it; it also keeps
    the head's weights as each call saw them."""

    def __init__(self, config, bad_calls):
        super().__init__(config)
        self.bad_calls, self.weights_seen = bad_calls, []

    def forward(self, idx, targets=None, **kwargs):
        logits, loss = super().forward(idx, targets, **kwargs)
        if self.training:
            if len(self.weights_seen) in self.bad_calls:
                loss = loss * float("nan")
            self.weights_seen.append(self.lm_head.weight.detach().clone())
        return logits, loss


def test_skip_nonfinite_skips_the_step_counts_and_logs_it(tmp_path, one_thread, monkeypatch):
    models = []
    monkeypatch.setattr(train_module, "build_model",
                        lambda cfg: models.append(NanAt(cfg.architecture(), {2, 4})) or models[-1])
    out_dir = tmp_path / "run"
    summary = train(compose(*CRASH, *data_overrides(tmp_path), f"out_dir={out_dir}", "train.max_iters=6",
                            "train.skip_nonfinite=true"))
    seen = models[0].weights_seen  # one training call per step: call k is step k
    assert torch.equal(seen[2], seen[3]) and torch.equal(seen[4], seen[5])  # no update on a skipped step
    assert not torch.equal(seen[1], seen[2]) and not torch.equal(seen[3], seen[4])
    assert summary["skipped_steps"] == 2 and torch.load(out_dir / "ckpt.pt", weights_only=True)["skipped_steps"] == 2
    assert [(r["iter"], r["skipped_steps"]) for r in read_metrics(out_dir, "skip")] == [(3, 1), (5, 2)]
    assert [r["iter"] for r in read_metrics(out_dir, "log")] == [1, 2, 4, 6]


def test_a_signal_in_process_raises_stopped_after_the_checkpoint_and_resume_goes_on(tmp_path, one_thread,
                                                                                   monkeypatch, capsys):
    args = [*CRASH, *data_overrides(tmp_path), "train.max_iters=8"]
    train(compose(*args, f"out_dir={tmp_path / 'straight'}"))
    real_step, steps = train_module.train_step, []

    def step_then_signal(*a, **kw):  # the signal arrives during step 3, as a Ctrl-C would
        steps.append(1)
        if len(steps) == 4:
            os.kill(os.getpid(), signal.SIGUSR1)
        return real_step(*a, **kw)

    monkeypatch.setattr(train_module, "train_step", step_then_signal)
    out_dir = tmp_path / "stopped"
    with pytest.raises(train_module.Stopped) as stopped:
        train(compose(*args, f"out_dir={out_dir}"))
    assert stopped.value.signum == signal.SIGUSR1
    assert torch.load(out_dir / "ckpt.pt", weights_only=True)["iter"] == 4  # the step it was in finished first
    assert f"stopped by signal {signal.SIGUSR1} at iter 4; checkpoint saved to {out_dir / 'ckpt.pt'}; " \
           f"continue with train.resume=true out_dir={out_dir}" in capsys.readouterr().out
    assert json.loads((out_dir / "status.json").read_text())["status"] == "stopped"
    monkeypatch.setattr(train_module, "train_step", real_step)
    train(compose(*args, f"out_dir={out_dir}", "train.resume=true"))
    straight = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=True)["model"]
    resumed = torch.load(out_dir / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(resumed[k], v) for k, v in straight.items())
