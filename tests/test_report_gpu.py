"""scripts/report/gpu.py: --smoke end to end in-process (both parts measured, each model by its recipe and labelled
with the dtype that ran, results.json, results.csv and gpu.png written with numbers in them), the LM runs evaluated
only at step 0 and after the budget, a rerun into the same --out, and the deadline's skip logic on a fake clock and
with no time at all."""
import csv
import json

import pytest
from conftest import compose, words_corpus

from attnlab.record import read_metrics
from attnlab.runtime import native_bf16
from scripts.report import gpu
from scripts.timing import Deadline
from train import train


def train_in_process(overrides):
    train(compose(*overrides))
    return 0  # train() raises where `python train.py` would exit non-zero


def smoke_argv(folder, monkeypatch):
    """argv for a --smoke run in folder (data/prepared is a relative path), LM runs of a second, train.py's train()
    in-process rather than a `python train.py` per run (the start-up is most of a smoke run)."""
    monkeypatch.chdir(folder)
    monkeypatch.setattr(gpu, "train_py_exit_code", train_in_process)
    monkeypatch.setitem(gpu.SIZES, "smoke", {**gpu.SIZES["smoke"], "lm_seconds": 1})
    return ["--smoke", "--out", str(folder / "gpu"), "--data-path", str(words_corpus(folder / "corpus.txt"))]


@pytest.fixture
def smoke(tmp_path, monkeypatch):
    return smoke_argv(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory):
    """One --smoke run's output folder, shared by the tests that only read it."""
    folder = tmp_path_factory.mktemp("smoke")
    with pytest.MonkeyPatch.context() as monkeypatch:
        gpu.main(smoke_argv(folder, monkeypatch))
    return folder / "gpu"


def test_smoke_measures_both_parts_and_writes_numbers(smoke_out):
    results = json.loads((smoke_out / "results.json").read_text())
    assert results["skipped"] == [] and results["smoke"]
    assert {(r["model"], r["T"]) for r in results["throughput"]} == {(m, T) for m in ("gpt", "lstm") for T in (16, 32)}
    assert all(r["tokens_per_s"] > 0 and r["batch"] * r["T"] == 128 for r in results["throughput"])
    params = {name: m["params"] for name, m in results["models"].items()}
    assert abs(params["gpt"] / params["lstm"] - 1) < 0.02  # matched sizes
    assert [r["model"] for r in results["lm"]] == ["gpt", "lstm"]
    for r in results["lm"]:
        assert r["steps"] > 0 and r["tokens"] == r["steps"] * 4 * 32 and 0 < r["val_loss"] < 10
        assert r["train_curve"] and all(loss > 0 for _, loss in r["train_curve"])
    rows = list(csv.DictReader((smoke_out / "results.csv").open()))
    assert len(rows) == 4 + 2 * 4 and all(float(r["value"]) > 0 for r in rows)
    assert (smoke_out / "gpu.png").exists()


def test_each_model_trains_by_its_recipe_in_the_dtype_its_label_says(smoke_out):
    results = json.loads((smoke_out / "results.json").read_text())
    lm = {r["model"]: r for r in results["lm"]}
    # Muon for both, each at its own muon_lr: the config's default for the GPT, configs/model/lstm.yaml's for the LSTM
    assert lm["gpt"]["optimizer"] == lm["lstm"]["optimizer"] == "muon"
    assert (lm["gpt"]["muon_lr"], lm["lstm"]["muon_lr"]) == (compose().train.muon_lr, 0.08)
    for name in ("gpt", "lstm"):  # the run's own config says so too
        saved = json.loads((smoke_out / f"lm-{name}" / "config.json").read_text())["config"]["train"]
        assert (saved["optimizer"], saved["muon_lr"], saved["dtype"]) == ("muon", lm[name]["muon_lr"],
                                                                         lm[name]["train_dtype"])
    # the labels are the dtypes observed on the attention's and the recurrence's outputs: bf16 autocast reaches the
    # GPT; the LSTM runs in fp32, where autocast would have cast it (to bf16 by oneDNN on a CPU that has it, to fp16
    # by cuDNN)
    assert {r["dtype"] for r in results["throughput"] if r["model"] == "gpt"} == {lm["gpt"]["dtype"]} == {"bfloat16"}
    assert {r["dtype"] for r in results["throughput"] if r["model"] == "lstm"} == {lm["lstm"]["dtype"]} == {"float32"}
    assert {name: m["train_dtype"] for name, m in results["models"].items()} == dict(gpt="bfloat16", lstm="float32")


def test_the_label_is_what_ran_not_what_was_asked(monkeypatch):
    """Under bf16 autocast the LSTM's recurrence runs in bf16 on a CPU with native bf16 (oneDNN) and in fp32 on one
    without (attnlab/rnn.py), and the label says which; with autocast asked for but none entered it says fp32."""
    cpu = gpu.torch.device("cpu")
    cfg = compose("model=lstm", "model.n_layer=2", "model.n_embd=16", "model.vocab_size=96", "train.dtype=bfloat16")
    assert gpu.lm_dtype(cfg, cpu) == ("bfloat16" if native_bf16(cpu) else "float32")
    autocast = gpu.autocast
    monkeypatch.setattr(gpu, "autocast", lambda device, dtype: autocast(device, None))
    assert gpu.lm_dtype(cfg, cpu) == "float32"


def test_lm_runs_evaluate_only_at_step_0_and_after_the_budget(smoke_out):
    """Evaluations and best.pt writes count against train.py's wall-clock budget: the only one inside it is step 0's."""
    for name in ("gpt", "lstm"):
        run_dir = smoke_out / f"lm-{name}"
        evals = read_metrics(run_dir, "eval")
        steps = max(r["iter"] for r in read_metrics(run_dir, "log"))
        assert [r["iter"] for r in evals][0] == 0 and len(evals) == 2 and evals[-1]["iter"] >= steps > 0
        assert evals[-1]["elapsed_s"] >= 1  # the last one came after the budget (lm_seconds=1) was spent


def test_a_rerun_into_the_same_out_completes_every_part(smoke, tmp_path, capsys):
    gpu.main(smoke)
    first = json.loads((tmp_path / "gpu" / "results.json").read_text())
    capsys.readouterr()
    gpu.main(smoke)
    second = json.loads((tmp_path / "gpu" / "results.json").read_text())
    assert second["skipped"] == [] and [r["model"] for r in second["lm"]] == ["gpt", "lstm"]
    assert len(second["throughput"]) == len(first["throughput"]) == 4
    out = capsys.readouterr().out
    assert "had not run on a GPU" in out  # until GPU_CHECKED is set
    assert "lm gpt: replacing the earlier run" in out and "lm lstm: replacing the earlier run" in out
    for name in ("gpt", "lstm"):  # a run of its own, evaluated at step 0 and after the budget
        assert len(read_metrics(tmp_path / "gpu" / f"lm-{name}", "eval")) == 2


def test_no_time_left_skips_every_part_and_says_so(smoke, tmp_path):
    gpu.main([*smoke, "--deadline-s", "0"])
    results = json.loads((tmp_path / "gpu" / "results.json").read_text())
    assert results["throughput"] == results["lm"] == []
    assert [line.split(":")[0] for line in results["skipped"]] == ["throughput T=16", "throughput T=32", "lm gpt",
                                                                    "lm lstm"]


def test_deadline_predicts_from_the_last_length_and_keeps_the_reserve():
    now = [0.0]
    deadline = Deadline(100, clock=lambda: now[0])
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


def test_help_says_what_it_does(capsys):
    with pytest.raises(SystemExit) as exit:
        gpu.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # as argparse wraps it
    assert exit.value.code == 0 and "on one GPU, in under 8 minutes" in out
    assert "--deadline-s" in out and "--smoke" in out
