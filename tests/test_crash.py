"""Crash safety: SIGKILL at each kind of moment then resume, SIGINT/SIGTERM, non-finite losses. CPU, tiny models.

The kill test SIGKILLs the real CLI (`python train.py ...`) once at each kind of moment, finishes the runs with train()
and compares them with a straight run of train().
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
from conftest import REPO, TINY, compose, data_overrides

import train as train_module
from attnlab.record import read_metrics
from data.corpus import prepare
from model import GPT
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


def run_chain(args, out_dir, kinds, seed, max_iters):
    """Start train.py, SIGKILL it at the moment each kind names, resume, ... Returns one (kind, checkpoint iter after
    the kill, killed mid-write) per kill."""
    rng = random.Random(seed)
    ckpt_path, kills, kinds = out_dir / "ckpt.pt", [], list(kinds)
    for n, kind in enumerate(kinds):  # kinds grows while it is iterated: a "write" kill that came late goes again
        before = torch.load(ckpt_path, weights_only=True)["iter"] if ckpt_path.exists() else 0
        log_file = out_dir.parent / f"{out_dir.name}-{n}.log"
        since_ns = time.time_ns()
        proc = start([*args, f"train.resume={ckpt_path.exists()}"], log_file)
        metrics = out_dir / "metrics.jsonl"  # until this process writes to it, it holds the killed run's lines

        def logged(target):
            return written_since(metrics, since_ns) and last_logged(out_dir) >= target

        target = before + rng.randint(2, 6)
        try:
            if kind == "first":  # a fresh run, at once after start-up: its first evaluation, best.pt, its first step
                wait_for(proc, log_file, lambda: "micro-step(s)" in log_file.read_text())
            elif kind == "resumed":  # a resumed run, at once after start-up: trimming metrics.jsonl, its first step
                wait_for(proc, log_file, lambda: "resuming from" in log_file.read_text())
            elif kind == "logged":  # between steps: at once when a step is logged, before its checkpoint
                wait_for(proc, log_file, lambda: logged(target))
            elif kind == "step":  # a moment after a step is logged: in the next step, or in a checkpoint
                wait_for(proc, log_file, lambda: logged(target))
                time.sleep(rng.uniform(0.001, 0.02))
            elif kind == "write":  # while ckpt.tmp or best.tmp is being written or fsynced, before its rename
                wait_for(proc, log_file, lambda: logged(target - 1) and fresh_write(out_dir, since_ns))
            else:  # "end": after the last step: its evaluation, its checkpoint, the plot, the teardown
                wait_for(proc, log_file, lambda: logged(max_iters))
        finally:
            proc.kill()
            proc.wait()
        resumed = re.search(r"resuming from .* at iter (\d+)", log_file.read_text())
        assert resumed is None or int(resumed[1]) == before
        assert (resumed is not None) == (before > 0) and (kind != "resumed" or before > 0)
        mid_write = fresh_write(out_dir, since_ns)
        after = 0
        if ckpt_path.exists():
            after = torch.load(ckpt_path, weights_only=True)["iter"]  # loads: never a torn file
            assert before <= after and last_logged(out_dir) - 1 <= after <= last_logged(out_dir)
        kills.append((kind, after, mid_write))
        if kind == "write" and not mid_write and kinds.count("write") < 3:  # the rename was quicker than the kill
            kinds.insert(n + 1, "write")
    return kills


@pytest.mark.slow
def test_sigkill_anywhere_then_resume_gives_the_losses_of_a_straight_run(tmp_path, one_thread):
    max_iters = 30
    args = [*CRASH, *data_overrides(tmp_path), f"train.max_iters={max_iters}", "train.checkpoint_interval=1"]
    train(compose(*args, f"out_dir={tmp_path / 'straight'}"))
    # one kill at each moment: before the first checkpoint (a fresh run's start), in a checkpoint write, after the
    # last step; between two steps, in a resumed run's start-up, in a step
    chains = {"killed-a": ["first", "write", "end"], "killed-b": ["logged", "resumed", "step"]}
    with ThreadPoolExecutor(2) as pool:  # two killed runs side by side: one per core, half the wall time
        futures = [pool.submit(run_chain, [*args, f"out_dir={tmp_path / name}"], tmp_path / name, kinds, seed,
                               max_iters) for seed, (name, kinds) in enumerate(chains.items())]
        kills = [kill for future in futures for kill in future.result()]
    for name in chains:  # then each finishes, resumed in this process (train.py's signal handlers need the main thread)
        train(compose(*args, f"out_dir={tmp_path / name}", f"train.resume={(tmp_path / name / 'ckpt.pt').exists()}"))

    straight = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=True)
    for name in chains:
        for event, keys in (("log", ("iter", "train_loss")), ("eval", ("iter", "train_loss", "val_loss"))):
            assert [[r[k] for k in keys] for r in read_metrics(tmp_path / name, event)] == \
                   [[r[k] for k in keys] for r in read_metrics(tmp_path / "straight", event)]
        resumed = torch.load(tmp_path / name / "ckpt.pt", weights_only=True)
        assert all(torch.equal(resumed["model"][k], v) for k, v in straight["model"].items())
    print(f"\n{len(kills)} SIGKILLs survived: {kills}")
    after = {kind: iter_ for kind, iter_, _ in kills}
    assert [kind for kind, _, _ in kills if kind != "write"] == ["first", "end", "logged", "resumed", "step"]
    assert after["first"] == 0 and after["end"] >= max_iters - 1  # each where it was meant
    assert any(mid_write for kind, _, mid_write in kills if kind == "write")


@pytest.mark.slow
def test_a_signal_saves_a_checkpoint_says_where_and_exits_nonzero(tmp_path):
    args = [*CRASH, *data_overrides(tmp_path), "train.max_iters=100000"]
    cfg = compose(*args)
    prepare(cfg.data, cfg.model.block_size)  # once, before the runs side by side read it

    def signalled(signum):
        out_dir, log_file = tmp_path / f"run-{signum}", tmp_path / f"train-{signum}.log"
        proc = start([*args, f"out_dir={out_dir}"], log_file)
        try:
            wait_for(proc, log_file, lambda: last_logged(out_dir) >= 3)
            proc.send_signal(signum)
            return proc.wait(timeout=60), out_dir, log_file.read_text()
        finally:
            proc.kill()

    signals = [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1]
    with ThreadPoolExecutor(len(signals)) as pool:  # one process per signal, side by side
        for signum, (code, out_dir, log) in zip(signals, pool.map(signalled, signals)):
            assert code == 128 + signum, (signum, log[-2000:])
            ckpt = torch.load(out_dir / "ckpt.pt", weights_only=True)
            assert f"stopped by signal {signum} at iter {ckpt['iter']}; checkpoint saved to {out_dir / 'ckpt.pt'}; " \
                   f"continue with train.resume=true out_dir={out_dir}" in log
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
