"""logger=wandb as wandb users expect: WANDB_* settings apply unless the command line sets a key, and a run wandb
refuses (no API key, a malformed one) ends in one line and exit status 2 with nothing recorded. Offline, no network:
wandb refuses a missing key before it connects."""
import json
import os
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import TINY, data_overrides, run_in_process, tiny_config

from attnlab.record import start_wandb


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """No WANDB_* from the machine and a HOME without a login, so wandb finds no API key; quiet."""
    wandb = pytest.importorskip("wandb")
    for name in [name for name in os.environ if name.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NETRC", str(home / ".netrc"))  # absent: no `wandb login` key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / ".config" / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()  # wandb keeps its settings in the process: start from none, whatever ran before
    yield
    wandb.teardown()


def train_with_wandb(tmp_path, *overrides):
    """`python train.py logger=wandb` on a tiny model, in-process; returns (exit status, stderr, out_dir)."""
    out_dir = tmp_path / "out"
    code, _, err = run_in_process("train.py", *TINY, *data_overrides(tmp_path), "logger=wandb", f"out_dir={out_dir}",
                                  *overrides)
    return code, err, out_dir


def offline_runs(folder):
    return list((folder / "wandb").glob("offline-run-*"))


def test_wandb_mode_from_the_environment_writes_an_offline_run(tmp_path, monkeypatch, wandb_env):
    monkeypatch.setenv("WANDB_MODE", "offline")
    code, err, out_dir = train_with_wandb(tmp_path)
    assert code == 0, err
    assert len(offline_runs(out_dir)) == 1  # in the run folder, for `wandb sync`
    assert json.loads((out_dir / "config.json").read_text())["config"]["logger"]["wandb_mode"] is None


def test_the_command_line_mode_beats_wandb_mode(tmp_path, monkeypatch, wandb_env):
    monkeypatch.setenv("WANDB_MODE", "online")  # online without a key would be refused
    code, err, out_dir = train_with_wandb(tmp_path, "logger.wandb_mode=offline")
    assert code == 0, err
    assert len(offline_runs(out_dir)) == 1


def test_wandb_dir_takes_the_wandb_folder(tmp_path, monkeypatch, wandb_env):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    code, err, out_dir = train_with_wandb(tmp_path)
    assert code == 0, err
    assert len(offline_runs(tmp_path / "wandb_dir")) == 1 and not (out_dir / "wandb").exists()


@pytest.mark.parametrize("api_key", [None, "not-a-key"])
def test_a_refused_login_is_one_line_and_records_nothing(tmp_path, monkeypatch, wandb_env, api_key):
    if api_key:
        monkeypatch.setenv("WANDB_API_KEY", api_key)
    code, err, out_dir = train_with_wandb(tmp_path)  # online, wandb's default
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: wandb could not start a run")
    assert "wandb login" in err and "WANDB_MODE=offline" in err and "logger.wandb_mode=offline" in err
    assert not any((out_dir / name).exists() for name in ("status.json", "config.json", "metrics.jsonl", "ckpt.pt"))


def test_settings_wandb_refuses_are_one_line_naming_the_key(tmp_path, monkeypatch, wandb_env):
    monkeypatch.setenv("WANDB_MODE", "bogus")  # wandb validates its settings with pydantic: a multi-line error
    code, err, out_dir = train_with_wandb(tmp_path)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: wandb refused its settings (mode: Input should be") and "logger.wandb=false" in err


def init_arguments(monkeypatch, cfg):
    """The keyword arguments start_wandb gives wandb.init, through a stand-in wandb module."""
    calls = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: calls.append(kwargs)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    start_wandb(cfg, Path(cfg.out_dir), wandb_id=None)
    return calls[0]


def test_the_project_is_the_command_line_s_then_wandb_project_then_attnlab(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    cfg = tiny_config(tmp_path)
    named = replace(cfg, logger=replace(cfg.logger, wandb_project="mine"))
    assert init_arguments(monkeypatch, cfg)["project"] == "attnlab"
    assert init_arguments(monkeypatch, cfg)["dir"] == cfg.out_dir  # wandb/ inside the run folder
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    assert init_arguments(monkeypatch, cfg)["project"] == "from-env"
    assert init_arguments(monkeypatch, named)["project"] == "mine"
