"""train.py end to end on tiny models: the CLI and the files of a run, exact resume (GPT, Muon, GRU), gradient
accumulation, sweeps, wandb offline, the time budget on an injected clock, MFU for an RNN, the full val loss."""
import json
import math
import sys
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, FakeClock, data_overrides, run_in_process, tiny_config

import attnlab.checkpoint as checkpoint_module
import train as train_module
from attnlab.batches import get_batch
from attnlab.checkpoint import load_checkpoint, load_model
from attnlab.config import ModelConfig
from attnlab.record import read_metrics
from attnlab.scoring import byte_counts, full_score
from data.corpus import load_split
from data.tokenizers import load_tokenizer
from train import train

pytestmark = pytest.mark.usefixtures("one_thread")


def crash_then_resume(cfg, monkeypatch, crash_at_save):
    """Train cfg until its crash_at_save-th ckpt.pt is on disk, crash there as a killed process would, then resume
    it to the end; returns the iteration the resumed run started from."""
    real_save, saved = checkpoint_module.save_checkpoint, []

    def save_then_crash(path, state):
        real_save(path, state)
        saved.append(Path(path).name)
        if saved.count("ckpt.pt") == crash_at_save:
            raise RuntimeError("simulated crash")

    monkeypatch.setattr(checkpoint_module, "save_checkpoint", save_then_crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg)
    monkeypatch.setattr(checkpoint_module, "save_checkpoint", real_save)
    resumed_from = load_checkpoint(Path(cfg.out_dir) / "ckpt.pt")["iter"]
    train(replace(cfg, train=replace(cfg.train, resume=True)))
    return resumed_from


def assert_same_weights(out_dir_a, out_dir_b):
    a, b = (load_checkpoint(Path(d) / "ckpt.pt")["model"] for d in (out_dir_a, out_dir_b))
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name


def test_cli_trains_and_writes_a_complete_run(tmp_path, one_thread):
    out = tmp_path / "run"
    code, _, err = run_in_process("train.py", *TINY, *data_overrides(tmp_path), f"out_dir={out}", "model.n_embd=32",
                                  "model.block_size=32", "train.batch_size=8", "train.max_iters=40",
                                  "train.eval_interval=20", "train.eval_iters=4", "train.learning_rate=3e-3",
                                  "train.warmup_iters=5")
    assert code == 0, err
    for name in ("ckpt.pt", "best.pt", "metrics.jsonl", "loss.png", "config.json", ".hydra/overrides.yaml"):
        assert (out / name).exists(), name
    evals = read_metrics(out, "eval")
    assert [e["iter"] for e in evals] == [0, 20, 40]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.8  # it learned
    logs = read_metrics(out, "log")
    assert {"iter", "train_loss", "lr", "tokens_per_sec", "elapsed_s"} <= logs[0].keys()
    assert "mfu" not in logs[0]  # a CPU has no known peak
    receipt = json.loads((out / "config.json").read_text())
    assert receipt["config"]["model"]["n_layer"] == 2 and "git_commit" in receipt
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter"] == 40 and ckpt["model_config"]["vocab_size"] == ckpt["meta"]["vocab_size"]


def test_resume_reproduces_the_straight_run(tmp_path, monkeypatch):
    straight = tiny_config(tmp_path / "a", checkpoint_interval=5)
    train(straight)
    interrupted = tiny_config(tmp_path / "b", checkpoint_interval=5)
    assert crash_then_resume(interrupted, monkeypatch, crash_at_save=2) == 10
    a, b = read_metrics(straight.out_dir, "log"), read_metrics(interrupted.out_dir, "log")
    assert [r["iter"] for r in a] == [r["iter"] for r in b] == [10, 20, 30]
    assert [r["train_loss"] for r in a] == [r["train_loss"] for r in b]
    assert [r["val_loss"] for r in read_metrics(straight.out_dir, "eval")] == \
           [r["val_loss"] for r in read_metrics(interrupted.out_dir, "eval")]
    assert_same_weights(straight.out_dir, interrupted.out_dir)


def test_gradient_accumulation_is_derived_from_tokens_per_step(tmp_path, capsys):
    cfg = tiny_config(tmp_path, batch_size=4, tokens_per_step=4 * 32 * 3, max_iters=2, eval_interval=2)
    train(cfg)
    assert "3 micro-step(s) of 128 tokens per step" in capsys.readouterr().out
    with pytest.raises(ValueError, match="not a multiple of batch_size x block_size"):
        train(tiny_config(tmp_path / "bad", batch_size=4, tokens_per_step=100))


def test_get_batch_targets_are_inputs_shifted_by_one():
    data = np.arange(100, dtype=np.uint16)
    x, y = get_batch(data, 16, 10, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert x.shape == y.shape == (16, 10) and x.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)


def test_sweep_gives_each_job_its_own_out_dir_and_one_wandb_group(tmp_path, one_thread):
    code, _, err = run_in_process("train.py", "-m", *TINY, "model.n_layer=1,2", *data_overrides(tmp_path),
                                  f"out_dir={tmp_path / 'sweep'}")
    assert code == 0, err
    for job, n_layer in (("0", 1), ("1", 2)):
        assert load_checkpoint(tmp_path / "sweep" / job / "ckpt.pt")["model_config"]["n_layer"] == n_layer
        receipt = json.loads((tmp_path / "sweep" / job / "config.json").read_text())
        assert receipt["config"]["logger"]["wandb_group"] == "sweep"  # the sweep's folder names the group


def test_wandb_gets_the_group_the_config_names(tmp_path, monkeypatch):
    calls = []

    class FakeRun:
        id = "fake-id"

        def log(self, *args, **kwargs):
            pass

        def finish(self, exit_code):
            calls.append(("finish", exit_code))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: calls.append(("init", kwargs)) or FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = tiny_config(tmp_path, max_iters=2, eval_interval=2)
    train(replace(cfg, logger=replace(cfg.logger, wandb=True, wandb_group="lr-search")))
    assert calls[0][0] == "init" and calls[0][1]["group"] == "lr-search" and calls[-1] == ("finish", 0)


@pytest.mark.slow
def test_wandb_offline_writes_a_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_config(tmp_path, max_iters=4, eval_interval=2)
    cfg = replace(cfg, logger=replace(cfg.logger, wandb=True, wandb_mode="offline", log_interval=1))
    train(cfg)
    runs = list((Path(cfg.out_dir) / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))
    wandb_id = torch.load(Path(cfg.out_dir) / "ckpt.pt", weights_only=True)["wandb_id"]
    assert runs[0].name.endswith(f"-{wandb_id}")  # the run's id is kept with its checkpoint
    train(replace(cfg, train=replace(cfg.train, max_iters=6, resume=True)))
    runs = sorted((Path(cfg.out_dir) / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(run.name.endswith(f"-{wandb_id}") for run in runs)  # one wandb run, continued
    assert torch.load(Path(cfg.out_dir) / "ckpt.pt", weights_only=True)["wandb_id"] == wandb_id


def test_a_resumed_run_continues_its_wandb_run(tmp_path, monkeypatch):
    inits = []

    class FakeRun:
        def __init__(self, id):
            self.id = id or f"new-{len(inits)}"

        def log(self, *args, **kwargs):
            pass

        def finish(self, exit_code):
            pass

    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: inits.append(kwargs) or FakeRun(kwargs["id"])
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = tiny_config(tmp_path, max_iters=2, eval_interval=2)
    cfg = replace(cfg, logger=replace(cfg.logger, wandb=True))
    train(cfg)
    train(replace(cfg, train=replace(cfg.train, max_iters=4, resume=True)))
    assert [(kw["id"], kw["resume"]) for kw in inits] == [(None, "allow"), ("new-1", "allow")]


def test_muon_trains_and_resumes_exactly(tmp_path, monkeypatch):
    straight = tiny_config(tmp_path / "a", optimizer="muon", max_iters=20, checkpoint_interval=10)
    train(straight)
    evals = read_metrics(straight.out_dir, "eval")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5  # it learned
    assert len(load_checkpoint(Path(straight.out_dir) / "ckpt.pt")["optimizer"]) == 2  # AdamW's state, then Muon's
    interrupted = tiny_config(tmp_path / "b", optimizer="muon", max_iters=20, checkpoint_interval=10)
    assert crash_then_resume(interrupted, monkeypatch, crash_at_save=1) == 10
    assert_same_weights(straight.out_dir, interrupted.out_dir)


def test_time_budget_stops_at_the_first_step_past_it_with_the_lr_decayed(tmp_path):
    # eval_interval=1: every step's elapsed seconds, as the loop read them, are in an eval row
    cfg = tiny_config(tmp_path, time_budget_s=5.0, max_iters=10**6, eval_interval=1, eval_iters=1,
                      checkpoint_interval=10**6, min_lr=1e-4)
    summary = train(cfg, clock=FakeClock(0.25))  # quarter seconds add up exactly in floating point
    evals = read_metrics(cfg.out_dir, "eval")
    assert [r["iter"] for r in evals] == list(range(summary["iters"] + 1))
    assert all(r["elapsed_s"] < 5.0 for r in evals[:-1]) and evals[-1]["elapsed_s"] >= 5.0
    assert evals[-1]["lr"] == pytest.approx(1e-4)  # the schedule's end
    last_step_lr = evals[-2]["lr"]  # evaluate logs the lr its step then takes
    assert 1e-4 < last_step_lr < 1e-4 + 0.02 * (3e-3 - 1e-4)  # less than 2% of the decay was left
    ckpt = load_checkpoint(Path(cfg.out_dir) / "ckpt.pt")
    assert ckpt["iter"] == summary["iters"] and ckpt["elapsed_s"] == evals[-1]["elapsed_s"]

    # resumed with a longer budget, the run counts on from the checkpoint's seconds and stops at the new budget
    train(replace(cfg, train=replace(cfg.train, resume=True, time_budget_s=8.0)), clock=FakeClock(0.25))
    resumed = [r for r in read_metrics(cfg.out_dir, "eval") if r["iter"] > ckpt["iter"]]
    assert ckpt["elapsed_s"] < resumed[0]["elapsed_s"] < ckpt["elapsed_s"] + 1.0
    assert all(r["elapsed_s"] < 8.0 for r in resumed[:-1]) and resumed[-1]["elapsed_s"] >= 8.0
    assert load_checkpoint(Path(cfg.out_dir) / "ckpt.pt")["elapsed_s"] == resumed[-1]["elapsed_s"]


def test_an_lstm_trains_through_the_mfu_path(tmp_path, monkeypatch):
    peak = 1e9  # FLOP/s; low, so that the tiny model's share of it is well above the 4 decimals logged
    monkeypatch.setattr(train_module, "peak_flops", lambda device: peak)
    cfg = tiny_config(tmp_path, max_iters=20)
    cfg = replace(cfg, model=ModelConfig(type="lstm", n_layer=1, n_embd=16, block_size=32))
    train(cfg, clock=FakeClock())
    model, _ = load_model(cfg.out_dir, "latest")
    logs = read_metrics(cfg.out_dir, "log")
    assert [r["iter"] for r in logs] == [10, 20]
    for row in logs:
        assert row["mfu"] > 0
        assert row["mfu"] == pytest.approx(model.flops_per_token() * row["tokens_per_sec"] / peak, abs=1e-3)


def test_a_gru_trains_and_resumes_exactly(tmp_path, monkeypatch):
    gru = ModelConfig(type="gru", n_layer=2, n_embd=32, block_size=32)
    straight = tiny_config(tmp_path / "a", max_iters=20, checkpoint_interval=10)
    train(replace(straight, model=gru))
    evals = read_metrics(straight.out_dir, "eval")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.3  # it learned (Muon, on its matrices too: ~0.35 nats)
    interrupted = tiny_config(tmp_path / "b", max_iters=20, checkpoint_interval=10)
    assert crash_then_resume(replace(interrupted, model=gru), monkeypatch, crash_at_save=1) == 10
    assert_same_weights(straight.out_dir, interrupted.out_dir)
    assert [r["train_loss"] for r in read_metrics(straight.out_dir, "log")] == \
           [r["train_loss"] for r in read_metrics(interrupted.out_dir, "log")]


def test_final_eval_full_logs_the_whole_val_split_loss(tmp_path):
    cfg = tiny_config(tmp_path, max_iters=4, eval_interval=4, final_eval="full")
    train(cfg)
    model, meta = load_model(cfg.out_dir, "latest")
    val = load_split(next(Path(cfg.data.dir).glob("*/meta.json")).parent, "val")  # not the .lock beside it
    expected = full_score(model, val, 8, 32, byte_counts(load_tokenizer(meta), torch.device("cpu")))
    last = read_metrics(cfg.out_dir, "eval")[-1]
    assert last["val_loss"] == pytest.approx(expected.loss, rel=1e-5)
    assert last["val_bpb"] == pytest.approx(expected.bits_per_byte, rel=1e-5)


def test_every_evaluation_row_has_bits_per_byte(tmp_path):
    cfg = tiny_config(tmp_path, max_iters=4, eval_interval=2)
    train(cfg)
    rows = read_metrics(cfg.out_dir, "eval")
    assert [r["iter"] for r in rows] == [0, 2, 4]
    for row in rows:  # CORPUS is ASCII: one byte per token, so bits per byte is the loss in bits
        assert row["val_bpb"] == pytest.approx(row["val_loss"] / math.log(2), rel=1e-5)
        assert row["train_bpb"] == pytest.approx(row["train_loss"] / math.log(2), rel=1e-5)
