"""scripts/runs.py and attnlab/compare.py's comparison of runs: the table (only the config keys that differ, best final
val loss first, crashed, running and empty folders shown as such), the status a run records, and the table a sweep
prints at its end."""
import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import TINY, data_overrides, run_in_process, tiny_config
from omegaconf import OmegaConf

import scripts.runs as runs_cli
from attnlab.compare import SweepSummary, compare_runs, find_runs, runs_table, short_value, summarize
from attnlab.config import flatten
from attnlab.distributed import Processes
from attnlab.record import RunLog, read_metrics, run_status
from train import train

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# a sweep of two learning rates, evaluated and logged at every step, so each job has a curve and a speed
SWEEP = [*TINY, "train.eval_interval=1", "logger.log_interval=1", "train.learning_rate=0.001,0.01"]


def table(text):
    """The cells of the Markdown table in text: the header, then one list per run (the alignment rule left out)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for i, line in enumerate(lines) if i != 1]


def column(rows, title):
    return [row[rows[0].index(title)] for row in rows[1:]]


def dead_pid():
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


def fake_run(folder, config=None, evals=(), logs=(), status=None, host=None, pid=None):
    """A run folder written by hand: config.json, metrics.jsonl ((iter, val_loss) evals, (iter, tokens/s) logs, one
    second an iteration) and status.json, each only where given."""
    folder.mkdir(parents=True)
    if config is not None:
        (folder / "config.json").write_text(json.dumps({"config": config, "argv": [], "git_commit": None}))
    rows = [{"event": "eval", "iter": it, "elapsed_s": float(it), "val_loss": loss} for it, loss in evals]
    rows += [{"event": "log", "iter": it, "elapsed_s": float(it), "tokens_per_sec": speed} for it, speed in logs]
    if rows:
        rows.sort(key=lambda row: row["iter"])
        (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if status is not None:
        (folder / "status.json").write_text(json.dumps({"status": status, "pid": pid or os.getpid(),
                                                        "host": host or socket.gethostname()}))
    return folder


def config(n_layer, learning_rate=0.001, out_dir="out"):
    return {"model": {"n_layer": n_layer, "n_head": 2}, "train": {"learning_rate": learning_rate}, "out_dir": out_dir}


def test_flatten_spells_keys_as_command_line_overrides():
    assert flatten({"model": {"n_layer": 2, "rope": {"base": 10000}}, "out_dir": "out"}) == \
           {"model.n_layer": 2, "model.rope.base": 10000, "out_dir": "out"}


def test_the_table_shows_only_the_keys_that_differ_best_final_val_loss_first(tmp_path):
    fake_run(tmp_path / "sweep" / "0", config(2, out_dir="a"), evals=[(0, 3.0), (10, 2.5)], status="finished")
    fake_run(tmp_path / "sweep" / "1", config(4, out_dir="b"), evals=[(0, 3.0), (10, 1.5), (20, 2.1)],
             logs=[(5, 100.0), (15, 300.0), (18, 200.0)], status="finished")
    fake_run(tmp_path / "sweep" / "2", config(4, 1e10, out_dir="c"), evals=[(0, 3.0), (10, float("nan"))],
             status="failed")
    fake_run(tmp_path / "sweep" / "10", config(8), evals=[(0, 3.0), (10, 2.0)], status="running")
    with (tmp_path / "sweep" / "10" / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"event": "eval", "iter": 20, "val')  # the line being written as we read
    fake_run(tmp_path / "empty")
    named = [tmp_path / "sweep", tmp_path / "sweep" / "1", tmp_path / "empty"]  # sweep/1 twice: shown once
    rows = [summarize(folder) for folder in find_runs(named)]
    cells = table(runs_table(rows))
    assert cells[0] == ["run", "status", "model.n_layer", "train.learning_rate", "iters", "final val loss",
                        "best val loss", "tokens/s", "wall time"]  # n_head and out_dir are left out; no bpb yet
    # the runs sorted by final val loss; a nan and no val loss at all come last
    assert column(cells, "run") == ["sweep/10", "sweep/1", "sweep/0", "sweep/2", "empty"]
    assert column(cells, "final val loss") == ["2.0000", "2.1000", "2.5000", "nan", "-"]
    assert column(cells, "best val loss") == ["2.0000", "1.5000", "2.5000", "3.0000", "-"]
    assert column(cells, "train.learning_rate") == ["0.001", "0.001", "0.001", "1e+10", "-"]
    assert column(cells, "status") == ["running", "finished", "finished", "failed", "no metrics"]
    assert cells[2][-2:] == ["200", "20.0 s"]  # the median speed, the last elapsed_s


def test_bits_per_byte_show_once_the_evals_have_them(tmp_path):
    run = fake_run(tmp_path / "a", config(2), evals=[(0, 3.0)], status="finished")
    assert "val bpb" not in runs_table([summarize(run)])
    (run / "metrics.jsonl").write_text(json.dumps({"event": "eval", "iter": 0, "elapsed_s": 90.0, "val_loss": 3.0,
                                                   "val_bpb": 4.3281}) + "\n")
    cells = table(runs_table([summarize(run)]))
    assert column(cells, "val bpb") == ["4.3281"] and column(cells, "wall time") == ["1 min 30 s"]


def test_a_running_status_whose_process_is_gone_shows_as_killed(tmp_path):
    assert run_status(fake_run(tmp_path / "alive", status="running")) == "running"
    assert run_status(fake_run(tmp_path / "gone", status="running", pid=dead_pid())) == "killed"
    # another machine's process cannot be checked from here
    assert run_status(fake_run(tmp_path / "remote", status="running", pid=dead_pid(), host="elsewhere")) == "running"
    old = fake_run(tmp_path / "old", evals=[(0, 3.0)])  # written before runs recorded a status
    assert run_status(old) is None and summarize(old)["status"] == "unknown"


def test_the_run_log_records_running_then_finished_stopped_or_failed(tmp_path):
    def run_log(folder):
        log = RunLog(replace(tiny_config(tmp_path), out_dir=str(tmp_path / folder)), Processes(torch.device("cpu")), 0)
        assert run_status(tmp_path / folder) == "running"
        return log

    run_log("done").close(finished=True)
    run_log("signal").close(finished=False)
    log = run_log("error")
    try:
        raise ValueError("the loss is nan at iter 3")
    except ValueError:
        log.close(finished=False)  # as train's finally does, while the error is on its way out
    statuses = [run_status(tmp_path / folder) for folder in ("done", "signal", "error")]
    assert statuses == ["finished", "stopped", "failed"]
    failed = json.loads((tmp_path / "error" / "status.json").read_text())
    assert failed["error"] == "ValueError: the loss is nan at iter 3" and failed["pid"] == os.getpid()
    assert not list(tmp_path.glob("*/status.tmp"))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A two-job sweep through the CLI (train.py -m, in-process): (its out_dir, what it printed)."""
    root = tmp_path_factory.mktemp("sweep")
    code, out, err = run_in_process("train.py", "-m", *SWEEP, *data_overrides(root), f"out_dir={root / 'sweep'}")
    assert code == 0, err
    return root / "sweep", out


def test_a_sweep_prints_its_table_when_it_ends_and_writes_the_png(sweep):
    out_dir, printed = sweep
    cells = table(printed)
    assert cells[0] == ["run", "status", "train.learning_rate", "iters", "final val loss", "best val loss",
                        "val bpb", "tokens/s", "wall time"]  # train.py logs bits per byte with every evaluation
    finals = {job: read_metrics(out_dir / job, "eval")[-1]["val_loss"] for job in ("0", "1")}
    assert column(cells, "run") == sorted(finals, key=finals.get)
    assert column(cells, "final val loss") == [f"{finals[job]:.4f}" for job in column(cells, "run")]
    assert sorted(column(cells, "train.learning_rate")) == ["0.001", "0.01"]
    assert column(cells, "status") == ["finished", "finished"] and column(cells, "iters") == ["2", "2"]
    assert (out_dir / "runs.png").read_bytes().startswith(PNG_MAGIC)


def test_runs_shows_crashed_killed_and_empty_folders_beside_a_sweep(sweep, tmp_path, one_thread, capsys):
    sweep_dir, _ = sweep
    failed = replace(tiny_config(tmp_path, learning_rate=1e10, grad_clip=0.0), out_dir=str(tmp_path / "nan"))
    with pytest.raises(ValueError, match="the loss is"):
        train(failed)
    killed = fake_run(tmp_path / "killed", json.loads((sweep_dir / "0" / "config.json").read_text())["config"],
                      evals=[(0, 9.0)], status="running", pid=dead_pid())
    (tmp_path / "empty").mkdir()
    png = tmp_path / "runs.png"
    capsys.readouterr()
    runs_cli.main([str(sweep_dir), str(tmp_path / "nan"), str(killed), str(tmp_path / "empty"), "--png", str(png)])
    printed = capsys.readouterr().out
    cells = table(printed)
    shared = Path(os.path.commonpath([sweep_dir, tmp_path]))  # the runs are named relative to it
    expected = {sweep_dir / "0": "finished", sweep_dir / "1": "finished", tmp_path / "nan": "failed",
                killed: "killed", tmp_path / "empty": "no metrics"}
    assert dict(zip(column(cells, "run"), column(cells, "status"))) == \
           {str(folder.relative_to(shared)): status for folder, status in expected.items()}
    assert column(cells, "run")[-1].endswith("empty") and column(cells, "final val loss")[-1] == "-"
    assert png.read_bytes().startswith(PNG_MAGIC) and f"validation curves: {png}" in printed


def test_a_folder_lists_the_run_in_it_and_the_runs_below_it(tmp_path):
    top = fake_run(tmp_path / "out", config(2), evals=[(0, 3.0)])
    jobs = [fake_run(top / str(i), config(2, learning_rate=lr), evals=[(0, 2.0)]) for i, lr in enumerate([0.1, 0.2])]
    assert find_runs([top]) == [top, *jobs]


def test_the_png_goes_into_the_one_folder_given(tmp_path, capsys):
    run = fake_run(tmp_path / "out", config(2), evals=[(0, 3.0), (1, 2.5)])
    compare_runs([run])
    assert (run / "runs.png").read_bytes().startswith(PNG_MAGIC) and not (tmp_path / "runs.png").exists()


def test_bookkeeping_keys_are_not_differences(tmp_path):
    bookkeeping = [{**config(2), "data": {"url": url, "dir": url}, "model": {"n_layer": 2, "vocab_size": vocab},
                    "train": {"learning_rate": 0.001, "resume": resume}}
                   for url, vocab, resume in (("a", 65, False), ("b", 50257, True))]
    runs = [fake_run(tmp_path / str(i), cfg, evals=[(0, 2.0)]) for i, cfg in enumerate(bookkeeping)]
    assert table(runs_table([summarize(run) for run in runs]))[0][:3] == ["run", "status", "iters"]


def test_legend_values_are_short():
    path = "/data/corpora/" + "x" * 40 + "/shakespeare.txt"
    assert short_value({"data.path": path}, "data.path") == "shakespeare.txt"
    assert len(short_value({"data.name": "y" * 100}, "data.name")) == 24


def test_a_sweep_summarises_its_own_jobs_and_names_an_earlier_run(tmp_path, capsys):
    sweep_dir = fake_run(tmp_path / "out", config(4), evals=[(0, 1.0)])  # a run from before the sweep
    summary = SweepSummary()
    summary.on_multirun_start(None)
    jobs = [fake_run(sweep_dir / str(i), config(2, learning_rate=lr), evals=[(0, 2.0 + i)])
            for i, lr in enumerate([0.1, 0.2])]
    for job in jobs:
        (job / ".hydra").mkdir()
    summary.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}}))
    printed = capsys.readouterr().out
    assert column(table(printed), "run") == ["0", "1"] and "also holds an earlier run" in printed
    assert (sweep_dir / "runs.png").exists()
