"""scripts/report/gpu.py: --smoke end to end in-process (both parts measured, results.json, results.csv and gpu.png
written with numbers in them), and the deadline's skip logic on a fake clock and with no time at all."""
import csv
import json

import pytest
from conftest import compose, words_corpus

from scripts.report import gpu
from train import train


def train_in_process(overrides):
    train(compose(*overrides))
    return 0  # train() raises where `python train.py` would exit non-zero


@pytest.fixture
def smoke(tmp_path, monkeypatch):
    """argv for a --smoke run in tmp_path (data/prepared and out/compare are relative paths), LM runs of a second,
    train.py's train() in-process rather than a `python train.py` per run (the start-up is most of a smoke run)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gpu, "train_run", train_in_process)
    monkeypatch.setitem(gpu.SIZES, "smoke", {**gpu.SIZES["smoke"], "lm_seconds": 1, "lm_eval_interval": 50})
    return ["--smoke", "--out", str(tmp_path / "gpu"), "--data-path", str(words_corpus(tmp_path / "corpus.txt"))]


def test_smoke_measures_both_parts_and_writes_numbers(smoke, tmp_path, capsys):
    gpu.main(smoke)
    results = json.loads((tmp_path / "gpu" / "results.json").read_text())
    assert results["skipped"] == [] and results["smoke"]
    assert {(r["model"], r["T"]) for r in results["throughput"]} == {(m, T) for m in ("gpt", "lstm") for T in (16, 32)}
    assert all(r["tokens_per_s"] > 0 and r["batch"] * r["T"] == 128 for r in results["throughput"])
    params = {name: m["params"] for name, m in results["models"].items()}
    assert abs(params["gpt"] / params["lstm"] - 1) < 0.02  # matched sizes
    assert [r["model"] for r in results["lm"]] == ["gpt", "lstm"]
    for r in results["lm"]:
        assert r["steps"] > 0 and r["tokens"] == r["steps"] * 4 * 32 and 0 < r["val_loss"] < 10
        assert r["lr"] == gpu.LRS[r["model"]]  # no lm experiment ran in tmp_path: the stated constants
    rows = list(csv.DictReader((tmp_path / "gpu" / "results.csv").open()))
    assert len(rows) == 4 + 2 * 4 and all(float(r["value"]) > 0 for r in rows)
    assert (tmp_path / "gpu" / "gpu.png").exists()
    assert "had not run on a GPU" in capsys.readouterr().out  # until GPU_CHECKED is set


def test_no_time_left_skips_every_part_and_says_so(smoke, tmp_path):
    gpu.main([*smoke, "--deadline-s", "0"])
    results = json.loads((tmp_path / "gpu" / "results.json").read_text())
    assert results["throughput"] == results["lm"] == []
    assert [line.split(":")[0] for line in results["skipped"]] == ["throughput T=16", "throughput T=32", "lm gpt",
                                                                    "lm lstm"]


def test_deadline_predicts_from_the_last_length_and_keeps_the_reserve():
    now = [0.0]
    deadline = gpu.Deadline(100, clock=lambda: now[0])
    assert gpu.predict_seconds({}, 256) == 0
    assert gpu.predict_seconds({256: 4.0, 512: 10.0}, 1024) == 20.0  # linear in T from the last one measured
    assert deadline.fits(20, reserve_s=80) and not deadline.fits(20, reserve_s=81)
    now[0] = 90.0
    assert deadline.left() == 10 and deadline.fits(10) and not deadline.fits(11)
    now[0] = 101.0
    assert not deadline.fits(0)  # past the end nothing starts, however small


def test_without_cuda_it_asks_for_smoke(capsys, monkeypatch):
    monkeypatch.setattr(gpu.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu.main([])
    assert "--smoke" in capsys.readouterr().err


def test_learning_rates_come_from_the_last_cpu_lm_experiment_where_there_is_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert gpu.learning_rates()[0] == gpu.LRS
    summary = tmp_path / "out" / "compare" / "lm" / "summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text(json.dumps(dict(preset="full", gpt=dict(lr=1e-3), lstm=dict(lr=5e-3))))
    assert gpu.learning_rates() == (dict(gpt=1e-3, lstm=5e-3), "out/compare/lm/summary.json (full)")


def test_help_says_what_it_does(capsys):
    with pytest.raises(SystemExit) as exit:
        gpu.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # as argparse wraps it
    assert exit.value.code == 0 and "on one GPU, in under 8 minutes" in out
    assert "--deadline-s" in out and "--smoke" in out
