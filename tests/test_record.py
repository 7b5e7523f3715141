"""attnlab/record.py: the receipt, metrics.jsonl and its trimming on resume, and silence on every rank but 0."""
import json
from dataclasses import replace

import torch
from conftest import tiny_config

from attnlab.distributed import Processes
from attnlab.record import RunLog, trim_metrics


def test_trim_metrics_keeps_rows_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"event": "log", "iter": i, "train_loss": 1.0 / i} for i in range(1, 8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"event": "log", "it')  # a power cut mid-line
    trim_metrics(path, 5)
    assert [json.loads(line)["iter"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5]
    trim_metrics(path, -1)  # a fresh run into the folder starts an empty file
    assert path.read_text() == ""


def test_rank_0_writes_the_receipt_and_rows_and_a_resume_continues_them(tmp_path):
    cfg = tiny_config(tmp_path)
    log = RunLog(cfg, Processes(torch.device("cpu")), start_iter=0)
    for it in (1, 2, 3):
        log.log("log", it, elapsed_s=0.1 * it, train_loss=float(it))
    log.close(finished=False)
    receipt = json.loads((tmp_path / "out" / "config.json").read_text())
    assert receipt["config"]["model"]["n_layer"] == 2 and receipt["world_size"] == 1 and "git_commit" in receipt
    resumed = replace(cfg, train=replace(cfg.train, resume=True))
    log = RunLog(resumed, Processes(torch.device("cpu")), start_iter=2)  # the checkpoint was at iter 2
    log.log("log", 3, elapsed_s=0.3, train_loss=30.0)
    log.close(finished=True)
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["iter"], r["train_loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_other_ranks_write_nothing(tmp_path):
    cfg = tiny_config(tmp_path)
    log = RunLog(cfg, Processes(torch.device("cpu"), rank=1, world_size=2, distributed=True), start_iter=0)
    log.print("not shown")
    log.log("log", 1, elapsed_s=0.1, train_loss=1.0)
    log.plot()
    log.close(finished=True)
    assert not (tmp_path / "out").exists()
