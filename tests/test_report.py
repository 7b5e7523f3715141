"""scripts/report's measuring tools: the counts behind Table 1. tests/test_report_retrieval.py has the synthetic
tasks, equal sizes, the bytes of state and each model's tuning; tests/test_report_lm.py the language-model experiments;
tests/test_report_cost.py the KV cache's bytes. No wall-clock asserts."""
import json
import os
import subprocess
import sys
from concurrent.futures import Future

import pytest
import torch

import scripts.report.__main__ as report_cli
from attnlab.config import ModelConfig
from model import GPT
from scripts.report import Context
from scripts.report.__main__ import Part
from scripts.report.lm import ROOT
from scripts.report.mechanism import autograd_depth, max_hops


def test_sequential_steps_constant_for_attention_linear_for_recurrence():
    block = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=256)).transformer.h[0]

    def depth(T):
        return autograd_depth(block(torch.randn(1, T, 16, requires_grad=True)).sum())

    assert depth(8) == depth(64) == depth(256)
    cell = torch.nn.LSTMCell(16, 16)

    def lstm_depth(T):
        h = c = torch.zeros(1, 16)
        for x in torch.randn(T, 1, 16, requires_grad=True):
            h, c = cell(x, (h, c))
        return autograd_depth(h.sum())

    per_step = lstm_depth(9) - lstm_depth(8)
    assert per_step > 0 and lstm_depth(64) - lstm_depth(8) == 56 * per_step
    assert max_hops(4096, lambda i, n: range(i + 1, n)) == 1
    assert max_hops(4096, lambda i, n: [i + 1] if i + 1 < n else []) == 4095


def test_a_partial_run_writes_each_preset_to_a_scratch_folder(tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)  # the scratch folder is relative to where the report runs
    monkeypatch.setattr(report_cli, "RESULTS", tmp_path / "results")  # and the committed reports stay as they are
    for flags, folder in (([], "quick"), (["--full"], "full")):
        monkeypatch.setattr(sys, "argv", ["scripts.report", "--only", "scaling", "--device", "cpu", *flags])
        report_cli.main()
        assert not (tmp_path / "results").exists()
        runs = json.loads((tmp_path / "out" / "report" / folder / "runs.json").read_text())
        assert runs["scaling"]["preset"] == ("full" if flags else "quick")


def test_the_report_opens_with_one_verdict_row_per_reason_merged_across_partial_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(report_cli, "PARTS", dict(mqar=None, lm=None, sizes=None, parallel=None))
    ctx = Context("quick", torch.device("cpu"), tmp_path, hardware="test CPU")
    ctx.verdict("mqar", "c", "GPT 100% vs LSTM 6% at 16 pairs", "shown here")
    ctx.verdict("lm", "b", "gap 0.1 nats", "shown here")
    report_cli.write_report(ctx, ["mqar", "lm"], {"mqar": 1.0, "lm": 2.0})
    later = Context("quick", torch.device("cpu"), tmp_path, hardware="test CPU")  # only sizes runs again
    later.verdict("sizes", "b", "gap flat", "not shown here")
    report_cli.write_report(later, ["sizes"], {"sizes": 3.0})
    table = (tmp_path / "results.md").read_text().split("\n\n")[2].splitlines()
    assert len(table) == 2 + 3 and table[2].startswith("| (a)")
    assert "no experiment of this run" in table[2] and "**not run**" in table[2]
    assert "lm: gap 0.1 nats; sizes: gap flat" in table[3]
    assert "**shown here (lm); not shown here (sizes)**" in table[3]  # the experiments disagree: each is named
    assert table[4].endswith("| mqar: GPT 100% vs LSTM 6% at 16 pairs | **shown here** |")
    with pytest.raises(ValueError, match="pick from"):
        ctx.verdict("lm", "b", "x", "proved")
    ctx.verdict("lm", "a", "x", "not shown here (needs a GPU)")  # a reason in brackets is allowed


def test_the_schedule_times_alone_what_measures_time_and_runs_each_reader_after_what_it_reads():
    parts = report_cli.PARTS
    assert {n for n, p in parts.items() if p.timed} == {"lm", "parallel", "long", "generation"}
    assert {n: p.reads for n, p in parts.items() if p.reads} == dict(context="sizes", text="lm", paths="lm")
    assert all(list(parts).index(n) > list(parts).index(p.reads) for n, p in parts.items() if p.reads)


class InProcessPool:
    """ProcessPoolExecutor's interface, running each job as it is submitted (the monkeypatched registry is seen) and
    restoring the threads a worker process would have kept to itself."""
    def __init__(self, jobs, mp_context=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, *args):
        future, threads = Future(), torch.get_num_threads()
        future.set_result(fn(*args))
        torch.set_num_threads(threads)
        return future


def test_jobs_run_timed_sources_alone_then_untimed_parts_in_workers_a_source_before_its_readers(tmp_path,
                                                                                                  monkeypatch):
    ran = []
    def part(name):
        def run(ctx):
            ran.append((name, torch.get_num_threads()))
            ctx.row(name, "m", "1", "2")
        return run
    names = ("scaling", "mqar", "lm", "sizes", "context", "text", "parallel")
    reads = dict(context="sizes", text="lm")
    monkeypatch.setattr(report_cli, "PARTS", {n: Part(part(n), timed=n in ("lm", "parallel"), reads=reads.get(n))
                                              for n in names})
    monkeypatch.setattr(report_cli, "ProcessPoolExecutor", InProcessPool)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ctx = Context("quick", torch.device("cpu"), tmp_path, hardware="main")
        seconds, hardware = report_cli.run_parts(ctx, list(names), jobs=2)
    finally:
        torch.set_num_threads(threads)
    # lm is timed: alone, first; sizes and its reader share a worker, submitted first; then the other untimed parts
    assert ran == [("lm", 2), ("sizes", 1), ("context", 1), ("scaling", 1), ("mqar", 1), ("text", 1), ("parallel", 2)]
    assert set(seconds) == set(names) and set(hardware) == {"sizes", "context", "text", "mqar", "scaling"}
    assert all(h.endswith("1 thread(s)") for h in hardware.values())
    assert sorted(r["experiment"] for r in ctx.rows) == sorted(names)  # the workers' rows come back
    # a part that reads runs where they are not there brings their experiment in, before it, so that its rows, grid
    # and verdict are written with the runs (and its time is counted as its own)
    monkeypatch.setattr(report_cli, "cached_lm", lambda ctx: None)
    monkeypatch.setattr(report_cli, "cached_sizes", lambda ctx: None)
    for jobs in (1, 2):
        ran.clear()
        seconds, _ = report_cli.run_parts(ctx, ["context", "text", "scaling"], jobs=jobs)
        assert [n for n, _ in ran] == (["lm", "sizes", "context", "scaling", "text"] if jobs == 2 else
                                       ["scaling", "lm", "sizes", "context", "text"])
        assert set(seconds) == {"lm", "sizes", "scaling", "context", "text"}
    monkeypatch.setattr(report_cli, "cached_sizes", lambda ctx: "the runs")  # there already: not run again
    ran.clear()
    assert set(report_cli.run_parts(ctx, ["context"], jobs=2)[0]) == {"context"} and [n for n, _ in ran] == ["context"]
    monkeypatch.setattr(report_cli, "PARTS", {"lm": Part(part("lm"), timed=True),
                                              "text": Part(part("text"), reads="lm")})
    ran.clear()
    report_cli.run_parts(Context("quick", torch.device("cpu"), tmp_path, text_run="out"), ["text"], jobs=2)
    assert [n for n, _ in ran] == ["text"]  # text reading another run needs no lm runs


def test_jobs_in_spawned_workers_write_the_part_and_its_thread_count(tmp_path):
    # a subprocess: under `python -m` the workers cannot import the command's __main__, which pytest's import hides
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    subprocess.run([sys.executable, "-m", "scripts.report", "--only", "scaling", "--device", "cpu", "--jobs", "2",
                    "--threads", "2", "--out", str(tmp_path)], check=True, cwd=ROOT, env=env, capture_output=True)
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert runs["scaling"]["hardware"].endswith(", 1 thread(s)")
    assert "scaling" in (tmp_path / "results.csv").read_text()
