"""Resume means the run's saved config plus only what the command line says now: `train.resume=true out_dir=RUN`
alone continues a run trained with any overrides exactly as a straight run; keys that cannot change mid-run are
refused in one line each, keys that may change apply and are recorded. Through train.py's main(), in-process."""
import json
import os
import shutil
import signal
import sys

import pytest
import torch
from conftest import REPO, words_corpus
from hydra.core.global_hydra import GlobalHydra

import train as train_module
from attnlab.cli import run_cli
from attnlab.record import read_metrics

FIXTURE = REPO / "tests" / "fixtures" / "v0"
# non-default model, data and optimizer choices, so that today's defaults would not fit the checkpoint
RUN = ["data=text", "model.norm=layernorm", "model.mlp=gelu", "model.qk_norm=false", "train.optimizer=adamw",
       "model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16", "train.batch_size=2",
       "train.max_iters=8", "train.eval_interval=4", "train.eval_iters=1", "train.warmup_iters=2",
       "train.device=cpu", "train.dtype=float32", "logger.log_interval=1"]


def cli(*args):
    """python train.py ARGS in this process: the exit status (0 when main returned)."""
    GlobalHydra.instance().clear()
    sys.argv = ["train.py", *args]
    try:
        run_cli(train_module.main)
    except SystemExit as e:
        return e.code
    return 0


@pytest.fixture
def stopped_run(tmp_path, monkeypatch, one_thread, capsys):
    """A run with RUN's overrides stopped by a signal after step 4 of 8, and the same run straight through."""
    monkeypatch.setattr(sys, "argv", sys.argv)  # restored afterwards
    data = [f"data.path={words_corpus(tmp_path / 'corpus.txt')}", f"data.dir={tmp_path / 'prepared'}"]
    assert cli(*RUN, *data, f"out_dir={tmp_path / 'straight'}") == 0
    real_step, steps = train_module.train_step, []

    def step_then_signal(*args, **kwargs):
        steps.append(1)
        if len(steps) == 4:
            os.kill(os.getpid(), signal.SIGUSR1)
        return real_step(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(train_module, "train_step", step_then_signal)
        assert cli(*RUN, *data, f"out_dir={tmp_path / 'run'}") == 128 + signal.SIGUSR1
    return tmp_path / "run", tmp_path / "straight"


def test_resume_alone_continues_as_a_straight_run_reading_its_checkpoint_once(stopped_run, capsys, monkeypatch):
    run, straight = stopped_run
    assert f"continue with train.resume=true out_dir={run}" in capsys.readouterr().out
    real_load, reads = torch.load, []
    monkeypatch.setattr(torch, "load", lambda f, *a, **kw: reads.append(str(f)) or real_load(f, *a, **kw))
    assert cli("train.resume=true", f"out_dir={run}") == 0  # the stop message's command, as printed
    assert reads.count(str(run / "ckpt.pt")) == 1  # for its config and its state alike
    monkeypatch.undo()
    resumed = torch.load(run / "ckpt.pt", weights_only=True)
    expected = torch.load(straight / "ckpt.pt", weights_only=True)
    assert resumed["iter"] == 8 and resumed["model_config"] == expected["model_config"]
    assert all(torch.equal(resumed["model"][k], v) for k, v in expected["model"].items())
    assert [r["val_loss"] for r in read_metrics(run, "eval")] == [r["val_loss"] for r in read_metrics(straight, "eval")]


def test_keys_that_may_change_apply_and_are_recorded(stopped_run, capsys):
    run, _ = stopped_run
    capsys.readouterr()
    assert cli("train.resume=true", f"out_dir={run}", "train.max_iters=10", "train.eval_interval=5") == 0
    assert "with train.eval_interval=5 (was 4), train.max_iters=10 (was 8)" in capsys.readouterr().out
    receipt = json.loads((run / "config.json").read_text())["config"]
    assert receipt["train"]["max_iters"] == 10 and receipt["model"]["norm"] == "layernorm"
    assert torch.load(run / "ckpt.pt", weights_only=True)["iter"] == 10


@pytest.mark.parametrize("override, named", [
    ("model.n_layer=2", "model.n_layer=1 vs 2"), ("train.optimizer=muon", "train.optimizer='adamw' vs 'muon'"),
    ("data.tokenizer=bpe", "data.tokenizer='char' vs 'bpe'"), ("model=lstm", "model.type='gpt' vs 'lstm'")])
def test_keys_that_cannot_change_are_refused_naming_each(stopped_run, capsys, override, named):
    run, _ = stopped_run
    capsys.readouterr()
    assert cli("train.resume=true", f"out_dir={run}", override) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {run} was trained with other values of keys a run cannot")
    assert named in err[0] and err[0].endswith("drop those overrides to resume, or train anew in another out_dir")


def test_a_format_0_checkpoint_resumes_with_its_data_path_alone(tmp_path, monkeypatch, one_thread):
    monkeypatch.setattr(sys, "argv", sys.argv)
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(FIXTURE / "ckpt_iter10.pt", out / "ckpt.pt")
    corpus = shutil.copy(FIXTURE / "corpus.txt", tmp_path / "corpus.txt")
    # data.dir only keeps the prepared corpus inside tmp_path; the fixture names a folder of the machine it came from
    assert cli("train.resume=true", f"out_dir={out}", f"data.path={corpus}", f"data.dir={tmp_path / 'p'}") == 0
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 20 and ckpt["config"]["train"]["optimizer"] == "adamw"
    assert ckpt["model_config"]["norm"] == "layernorm" and ckpt["config"]["train"]["warmup_iters"] == 5
