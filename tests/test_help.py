"""Every command answers --help with what it does, in-process as on the command line."""
import sys

import pytest
from hydra.core.global_hydra import GlobalHydra

import data.prepare
import sample
import scripts.attention
import scripts.bench
import scripts.evaluate
import scripts.export
import scripts.hellaswag
import scripts.report.__main__
import scripts.report.gpu
import scripts.runs
import train
from attnlab.cli import run_cli

# command: (its main, what its help must say)
HYDRA_COMMANDS = {
    "train.py": (train.main, "train.muon_lr Muon's"),
    "sample.py": (sample.main, "Generate text from a training run's checkpoint"),
    "scripts.evaluate": (scripts.evaluate.main, "Score a run's checkpoint"),
    "scripts.attention": (scripts.attention.main, "what each head of a run's checkpoint attends to"),
    "scripts.export": (scripts.export.main, "Hugging Face folder"),
    "scripts.hellaswag": (scripts.hellaswag.main, "on HellaSwag's validation set, llm.c's completion style"),
}
ARGPARSE_COMMANDS = {
    "scripts.runs": (scripts.runs.main, "Compare training runs"),
    "scripts.bench": (scripts.bench.main, "Benchmarks"),
    "scripts.report": (scripts.report.__main__.main, "attention"),
    "scripts.report.gpu": (scripts.report.gpu.main, "--smoke"),
}


@pytest.mark.parametrize("command", HYDRA_COMMANDS)
def test_hydra_commands_say_what_they_do_and_list_their_keys(command, monkeypatch, capsys):
    main, what = HYDRA_COMMANDS[command]
    monkeypatch.setattr(sys, "argv", [command, "--help"])
    GlobalHydra.instance().clear()
    with pytest.raises(SystemExit) as exit:
        run_cli(main)
    out = capsys.readouterr().out
    assert exit.value.code == 0 and what in out and "== Config ==" in out and "out_dir:" in out


@pytest.mark.parametrize("command", ARGPARSE_COMMANDS)
def test_argparse_commands_say_what_they_do(command, monkeypatch, capsys):
    main, what = ARGPARSE_COMMANDS[command]
    monkeypatch.setattr(sys, "argv", [command, "--help"])
    with pytest.raises(SystemExit) as exit:
        main()
    assert exit.value.code == 0 and what in capsys.readouterr().out


def test_prepare_says_what_it_does(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["data.prepare", "--help"])
    data.prepare.main()
    out = capsys.readouterr().out
    assert "Prepare a corpus" in out and "python train.py --help" in out
