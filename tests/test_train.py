"""train.py end to end on a tiny model: the CLI, files of a run, exact resume, sweeps, wandb offline, GPT-2 init."""
import json
import os
import subprocess
import sys
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import train as train_module
from conftest import tiny_config
from train import get_lr, load_checkpoint, train

ROOT = Path(__file__).resolve().parent.parent


def run_cli(script, *args, cwd=ROOT):
    return subprocess.run([sys.executable, script, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def read_metrics(out_dir, event):
    rows = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["event"] == event]


def test_cli_trains_and_writes_a_complete_run(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"print({i} + {i})\n" for i in range(2000)))
    out = tmp_path / "run"
    result = run_cli("train.py", "data=text", f"data.path={corpus}", f"data.dir={tmp_path / 'data'}", f"out_dir={out}",
                     "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
                     "train.batch_size=8", "train.max_iters=40", "train.eval_interval=20", "train.eval_iters=4",
                     "train.learning_rate=3e-3", "train.warmup_iters=5")
    assert result.returncode == 0, result.stderr
    for name in ("ckpt.pt", "best.pt", "metrics.jsonl", "loss.png", "config.json", ".hydra/overrides.yaml"):
        assert (out / name).exists(), name
    evals = read_metrics(out, "eval")
    assert [e["iter"] for e in evals] == [0, 20, 40]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.0  # it learned
    logs = read_metrics(out, "log")
    assert {"iter", "train_loss", "lr", "tokens_per_sec", "elapsed_s"} <= logs[0].keys()
    receipt = json.loads((out / "config.json").read_text())
    assert receipt["config"]["model"]["n_layer"] == 2 and "git_commit" in receipt
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter"] == 40 and ckpt["model_config"]["vocab_size"] == ckpt["meta"]["vocab_size"]


def test_resume_reproduces_the_straight_run(tmp_path, monkeypatch):
    straight = tiny_config(tmp_path / "a", checkpoint_interval=5)
    train(straight)
    interrupted = tiny_config(tmp_path / "b", checkpoint_interval=5)
    saves = []
    real_save = train_module.save_checkpoint

    def crash_after_second_checkpoint(path, state):
        real_save(path, state)
        saves.append(path.name)
        if saves.count("ckpt.pt") == 2:  # iteration 10
            raise RuntimeError("simulated crash")

    monkeypatch.setattr(train_module, "save_checkpoint", crash_after_second_checkpoint)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(interrupted)
    monkeypatch.setattr(train_module, "save_checkpoint", real_save)
    assert load_checkpoint(Path(interrupted.out_dir) / "ckpt.pt")["iter"] == 10
    train(replace(interrupted, train=replace(interrupted.train, resume=True)))
    a, b = read_metrics(straight.out_dir, "log"), read_metrics(interrupted.out_dir, "log")
    assert [r["iter"] for r in a] == [r["iter"] for r in b]
    assert [r["train_loss"] for r in a] == [r["train_loss"] for r in b]
    assert [r["val_loss"] for r in read_metrics(straight.out_dir, "eval")] == \
           [r["val_loss"] for r in read_metrics(interrupted.out_dir, "eval")]


def test_lr_schedule_warms_up_then_decays_to_min_lr(tmp_path):
    cfg = tiny_config(tmp_path, warmup_iters=10, max_iters=100, learning_rate=1e-3, min_lr=1e-4)
    lrs = [get_lr(it, cfg) for it in range(101)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[100] == pytest.approx(1e-4)


def test_gradient_accumulation_is_derived_from_tokens_per_step(tmp_path, capsys):
    cfg = tiny_config(tmp_path, batch_size=4, tokens_per_step=4 * 32 * 3, max_iters=2, eval_interval=2)
    train(cfg)
    assert "3 micro-step(s) of 128 tokens per step" in capsys.readouterr().out
    with pytest.raises(ValueError, match="not a multiple of batch_size x block_size"):
        train(tiny_config(tmp_path / "bad", batch_size=4, tokens_per_step=100))


def test_get_batch_targets_are_inputs_shifted_by_one():
    data = np.arange(100, dtype=np.uint16)
    x, y = train_module.get_batch(data, 16, 10, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert x.shape == y.shape == (16, 10)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)


@pytest.mark.slow
def test_sweep_gives_each_job_its_own_out_dir(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("abcdefgh" * 200)
    result = run_cli("train.py", "-m", "model.n_layer=1,2", "data=text", f"data.path={corpus}",
                     f"data.dir={tmp_path / 'data'}", f"out_dir={tmp_path / 'sweep'}", "model.n_head=2",
                     "model.n_embd=16", "model.block_size=16", "train.batch_size=4", "train.max_iters=2",
                     "train.eval_interval=2", "train.eval_iters=1")
    assert result.returncode == 0, result.stderr
    for job, n_layer in (("0", 1), ("1", 2)):
        assert load_checkpoint(tmp_path / "sweep" / job / "ckpt.pt")["model_config"]["n_layer"] == n_layer


@pytest.mark.slow
def test_wandb_offline_writes_a_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_config(tmp_path, max_iters=4, eval_interval=2)
    cfg = replace(cfg, logger=replace(cfg.logger, wandb=True, wandb_mode="offline", log_interval=1))
    train(cfg)
    runs = list((Path(cfg.out_dir) / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))


def test_muon_trains_and_resumes_exactly(tmp_path, monkeypatch):
    straight = tiny_config(tmp_path / "a", optimizer="muon", max_iters=20, checkpoint_interval=10)
    train(straight)
    evals = read_metrics(straight.out_dir, "eval")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5  # it learned
    interrupted = tiny_config(tmp_path / "b", optimizer="muon", max_iters=20, checkpoint_interval=10)
    real_save = train_module.save_checkpoint

    def crash_at_iteration_10(path, state):
        real_save(path, state)
        if path.name == "ckpt.pt":
            raise RuntimeError("simulated crash")

    monkeypatch.setattr(train_module, "save_checkpoint", crash_at_iteration_10)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(interrupted)
    monkeypatch.setattr(train_module, "save_checkpoint", real_save)
    train(replace(interrupted, train=replace(interrupted.train, resume=True)))
    a, b = (load_checkpoint(Path(c.out_dir) / "ckpt.pt") for c in (straight, interrupted))
    assert len(a["optimizer"]) == 2  # AdamW's state, then Muon's momentum buffers
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_time_budget_stops_on_time_with_the_lr_decayed(tmp_path):
    cfg = tiny_config(tmp_path, time_budget_s=2.0, max_iters=10**6, eval_interval=10**6, min_lr=1e-4)
    summary = train(cfg)
    final = read_metrics(cfg.out_dir, "eval")[-1]
    assert 0 < summary["iters"] < 10**6 and final["iter"] == summary["iters"]
    assert 2.0 <= final["elapsed_s"] < 4.0  # the budget, plus the last step and the evaluation
    assert read_metrics(cfg.out_dir, "log")[-1]["lr"] < 2e-4  # the cosine ran its course within the budget
    assert get_lr(10, cfg, seconds=0.0) > get_lr(10, cfg, seconds=1.0) > get_lr(10, cfg, seconds=2.0) == 1e-4


def test_full_loss_scores_every_token_once_with_its_block_as_context():
    torch.manual_seed(0)
    model = train_module.GPT(train_module.ModelConfig(vocab_size=11, n_layer=1, n_head=2, n_embd=16, block_size=8))
    data = np.random.default_rng(0).integers(0, 11, 103).astype(np.uint16)  # 12 blocks of 8, then a tail of 6
    seen = []

    class Recorder(torch.nn.Module):
        def forward(self, x, y):
            seen.append(y.flatten())
            return model(x, y)

    loss = train_module.full_loss(Recorder(), data, 5, 8, torch.device("cpu"), nullcontext())
    ids = torch.from_numpy(data.astype(np.int64))
    assert torch.equal(torch.cat(seen), ids[1:])
    nll = []  # the reference: each block on its own, every position's loss
    for s in range(0, len(ids) - 1, 8):
        x, y = ids[s:min(s + 8, len(ids) - 1)], ids[s + 1:s + 9]
        nll.append(F.cross_entropy(model(x[None])[0][0], y, reduction="none"))
    assert loss == pytest.approx(torch.cat(nll).mean().item(), rel=1e-5)


def test_final_eval_full_logs_the_whole_val_split_loss(tmp_path):
    cfg = tiny_config(tmp_path, max_iters=4, eval_interval=4, final_eval="full")
    train(cfg)
    ckpt = load_checkpoint(Path(cfg.out_dir) / "ckpt.pt")
    model = train_module.GPT(train_module.ModelConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    val = train_module.load_split(next(Path(cfg.data.dir).iterdir()), "val")
    expected = train_module.full_loss(model.eval(), val, 8, 32, torch.device("cpu"), nullcontext())
    assert read_metrics(cfg.out_dir, "eval")[-1]["val_loss"] == pytest.approx(expected, rel=1e-5)
