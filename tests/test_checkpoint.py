"""attnlab/checkpoint.py: a file from before the format number resumes exactly where it stopped; a failed write (a full
disk) keeps the previous checkpoint, leaves no temporary file and says so in one line; a newer format is refused;
load_model picks the right file and build_model the right class. CPU, tiny models, seconds (the full-disk cases on a
real tmpfs need root)."""
import errno
import json
import os
import shutil
import subprocess
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from conftest import REPO, TINY, FakeClock, compose, data_overrides, run_in_process

import attnlab.checkpoint as checkpoint
from attnlab.checkpoint import FORMAT, build_model, load_checkpoint, load_model, save_checkpoint
from attnlab.config import ModelConfig
from attnlab.record import read_metrics
from attnlab.rnn import RNN
from model import GPT
from train import train

FIXTURE = REPO / "tests" / "fixtures" / "v0"  # README.md there says how ckpt_iter10.pt was made
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
# the defaults that the fixture's run took and that have changed since (the defaults' dtype, auto, is fp32 there)
V0_DEFAULTS = ["model.norm=layernorm", "model.mlp=gelu", "model.qk_norm=false", "train.optimizer=adamw",
               "train.dtype=float32"]
# the CPU kernels the fixture was made with, so they repeat its arithmetic bit for bit; torch's AVX512 kernels round
# differently, within the tolerance below
EXACT_CAPABILITY = "AVX2"
SMALL = ModelConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8)


def state(value, size=4):
    """The smallest dict load_checkpoint accepts, its weight filled with value."""
    return {"model": {"w": torch.full((size,), value)}, "model_config": asdict(SMALL), "meta": {"value": value}}


def one_line(error, *phrases):
    """Assert that error's message is one line holding every phrase."""
    message = str(error.value)
    assert "\n" not in message and all(p in message for p in phrases), message


# ---- format 0: the files written before the redesign ----

def test_a_format_0_checkpoint_resumes_exactly_where_it_stopped(tmp_path, one_thread):
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(FIXTURE / "ckpt_iter10.pt", out / "ckpt.pt")
    corpus = shutil.copy(FIXTURE / "corpus.txt", tmp_path / "corpus.txt")
    cfg = compose(*EXPECTED["overrides"], *V0_DEFAULTS, f"data.path={corpus}", f"data.dir={tmp_path / 'prepared'}",
                  f"out_dir={out}", "train.resume=true")
    train(cfg, clock=FakeClock())

    logs, evals = read_metrics(out, "log"), read_metrics(out, "eval")
    assert [r["iter"] for r in logs] == list(range(11, 21)) and [r["iter"] for r in evals] == [20]
    losses, final = [r["train_loss"] for r in logs], evals[0]["val_loss"]
    expected = [loss for it, loss in EXPECTED["log"] if it > 10]
    assert losses == pytest.approx(expected, abs=1e-3)
    assert final == pytest.approx(EXPECTED["final_val_loss"], abs=1e-3)
    if (torch.__version__, torch.get_num_threads(), torch.backends.cpu.get_cpu_capability()) == (
            EXPECTED["torch"], EXPECTED["threads"], EXACT_CAPABILITY):
        assert losses == expected and final == EXPECTED["resumed_final_val_loss"]  # the same arithmetic, bit for bit


def test_a_format_0_checkpoint_loads_and_rebuilds_its_model():
    ckpt = load_checkpoint(FIXTURE / "ckpt_iter10.pt")
    assert "format" not in ckpt and ckpt["iter"] == 10
    model = build_model(ckpt["model_config"])
    model.load_state_dict(ckpt["model"])  # strict: every name and shape matches
    assert isinstance(model, GPT) and model.context_window == 16


# ---- a failed write ----

def test_a_failed_fsync_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, state(1.0))

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", full_disk)
    with pytest.raises(OSError) as error:
        save_checkpoint(path, state(2.0))
    one_line(error, "could not write checkpoint", "(No space left on device)", "the previous ckpt.pt is intact")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no ckpt.tmp
    kept = load_checkpoint(path)
    assert torch.equal(kept["model"]["w"], torch.full((4,), 1.0)) and kept["meta"] == {"value": 1.0}


def test_torch_saves_opaque_full_disk_error_is_named(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, state(1.0))

    def torn_write(obj, f):  # what torch.save does when the disk fills under it
        f.write(b"PK\x03\x04 half a zip file")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(checkpoint.torch, "save", torn_write)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda _: SimpleNamespace(total=2 ** 30, used=2 ** 30, free=0))
    with pytest.raises(OSError) as error:
        save_checkpoint(path, state(2.0))
    one_line(error, "the disk is full", "the previous ckpt.pt is intact")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.full((4,), 1.0))


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 256 KiB disk (tmpfs) at tmp_path/disk; skips where this process may not mount one."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)]
    if os.geteuid() != 0 or not shutil.which("mount") or subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("a real full disk needs root and mount -t tmpfs")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_tmpfs_keeps_the_previous_checkpoint(tiny_disk):
    path = tiny_disk / "ckpt.pt"
    save_checkpoint(path, state(1.0))
    with pytest.raises(OSError) as error:
        save_checkpoint(path, state(2.0, size=100_000))  # 400 KB on a 256 KiB disk
    one_line(error, "could not write checkpoint", "the previous ckpt.pt is intact")
    assert "the disk is full" in str(error.value) or "No space left on device" in str(error.value)
    assert [p.name for p in tiny_disk.iterdir()] == ["ckpt.pt"]
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.full((4,), 1.0))


def test_train_py_on_a_full_disk_exits_with_one_line_whose_advice_works(tiny_disk, tmp_path, one_thread):
    # n_embd=64 (the later override wins): a checkpoint of ~1 MB, so the first write, best.pt at iter 0, fails
    args = [*TINY, "model.n_embd=64", *data_overrides(tmp_path), f"out_dir={tiny_disk / 'run'}"]
    code, out, err = run_in_process("train.py", *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: could not write checkpoint") and "Traceback" not in out
    assert not list((tiny_disk / "run").glob("*.tmp"))

    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_disk)], check=True)  # "free some space"
    advice = ["train.resume=true"] if "train.resume=true" in lines[0] else []
    code, _, err = run_in_process("train.py", *args, *advice)
    assert code == 0, err


# ---- format numbers, picking a file, building a model ----

def test_a_round_trip_stamps_the_current_format(tmp_path):
    save_checkpoint(tmp_path / "ckpt.pt", state(3.0))
    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert ckpt["format"] == FORMAT and ckpt["meta"] == {"value": 3.0}
    assert torch.equal(ckpt["model"]["w"], torch.full((4,), 3.0))


def test_a_newer_format_is_refused_naming_the_fix(tmp_path):
    torch.save({**state(1.0), "format": FORMAT + 1}, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError) as error:
        load_checkpoint(tmp_path / "ckpt.pt")
    one_line(error, f"checkpoint format {FORMAT + 1}, newer than this code's {FORMAT}", "update attnlab (git pull)")


def save_model(out_dir, name, seed):
    """A checkpoint of SMALL with seeded weights, its meta naming the file; returns the state dict."""
    out_dir.mkdir(exist_ok=True)
    torch.manual_seed(seed)
    weights = build_model(SMALL).state_dict()
    save_checkpoint(out_dir / name, {"model": weights, "model_config": asdict(SMALL), "meta": {"file": name}})
    return weights


@pytest.mark.parametrize("files, which, chosen", [
    (["best.pt", "ckpt.pt"], "best", "best.pt"),
    (["ckpt.pt"], "best", "ckpt.pt"),  # a run that never evaluated has no best.pt yet
    (["best.pt", "ckpt.pt"], "latest", "ckpt.pt"),
])
def test_load_model_picks_the_file_asked_for(tmp_path, files, which, chosen):
    saved = {name: save_model(tmp_path, name, seed) for seed, name in enumerate(files)}
    model, meta = load_model(tmp_path, which)
    assert meta == {"file": chosen} and not model.training
    assert all(torch.equal(v, saved[chosen][k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("files, which, error, message", [
    (["ckpt.pt"], "newest", ValueError, r"^checkpoint='newest' is unknown; use best or latest$"),
    ([], "best", FileNotFoundError, r"^no checkpoint in .*; train one with: python train.py out_dir=.*nowhere$"),
    (["best.pt"], "latest", FileNotFoundError, "no checkpoint in"),  # latest is ckpt.pt alone
])
def test_load_model_names_what_is_wrong(tmp_path, files, which, error, message):
    out_dir = tmp_path / ("run" if files else "nowhere")  # "nowhere" is never made
    for seed, name in enumerate(files):
        save_model(out_dir, name, seed)
    with pytest.raises(error, match=message):
        load_model(out_dir, which)


@pytest.mark.parametrize("model_type, cls, layer", [("gpt", GPT, None), ("lstm", RNN, nn.LSTM), ("gru", RNN, nn.GRU)])
def test_build_model_builds_the_type_a_dict_names(model_type, cls, layer):
    model_cfg = ModelConfig(type=model_type, vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8)
    model = build_model(asdict(model_cfg))  # as a checkpoint holds it
    assert type(model) is cls
    assert layer is None or isinstance(model.rnn, layer)
    assert model.num_params() == build_model(model_cfg).num_params()
