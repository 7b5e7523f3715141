"""Host reads in the training loop, counted on the CPU: on a GPU each read of a device tensor's value makes the CPU
wait for the device, so the loop reads the loss, the non-finite steps and the stop signal at log steps only."""
from dataclasses import replace

import pytest
import torch
from conftest import tiny_config
from test_crash import NanAt  # a GPT whose training loss is nan on chosen calls

import train as train_module
from train import train

pytestmark = pytest.mark.usefixtures("one_thread")
READS = ("item", "tolist", "__float__", "__int__", "__bool__")


class HostReads:
    """Counts calls of torch.Tensor's value readers while counting is on."""

    def __init__(self, monkeypatch):
        self.count, self.on = 0, True
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, self.counted(getattr(torch.Tensor, name)))

    def counted(self, read):
        def wrapper(tensor, *args, **kwargs):
            self.count += self.on
            return read(tensor, *args, **kwargs)
        return wrapper

    def paused(self, fn):
        """fn, with counting off while it runs."""
        def wrapper(*args, **kwargs):
            self.on = False
            try:
                return fn(*args, **kwargs)
            finally:
                self.on = True
        return wrapper


@pytest.mark.parametrize("optimizer, ngram", [("adamw", 0), ("muon", 0), ("muon", 4)])
def test_the_loop_reads_the_device_at_log_steps_only(tmp_path, monkeypatch, optimizer, ngram):
    cfg = tiny_config(tmp_path, max_iters=200, eval_interval=1000, optimizer=optimizer)
    cfg = replace(cfg, model=replace(cfg.model, ngram=ngram), logger=replace(cfg.logger, log_interval=1000))
    reads = HostReads(monkeypatch)
    monkeypatch.setattr(train_module, "validate", reads.paused(train_module.validate))  # evaluation is not a step
    monkeypatch.setattr(train_module.TrainingState, "save", reads.paused(train_module.TrainingState.save))
    reads.count = 0
    assert train(cfg)["iters"] == 200
    assert reads.count / 200 <= 0.1, reads.count  # one read per step before: the loss, for its finiteness


def test_a_nonfinite_loss_read_at_the_next_log_step_still_stops_the_run_with_its_iteration(tmp_path, monkeypatch):
    models = []
    monkeypatch.setattr(train_module, "build_model",
                        lambda cfg: models.append(NanAt(cfg.architecture(), {7})) or models[-1])
    cfg = tiny_config(tmp_path, max_iters=30, eval_interval=20)
    cfg = replace(cfg, logger=replace(cfg.logger, log_interval=5))
    with pytest.raises(ValueError, match=r"the loss is nan at iter 7; stopped before its optimizer step"):
        train(cfg)
    seen = models[0].weights_seen
    assert len(seen) == 10  # read at iter 10, the next log step
    assert all(torch.equal(seen[7], w) for w in seen[8:])  # from the bad step on, no step was taken


def test_under_torchrun_the_time_budget_reads_rank0s_clock_at_log_steps_only(tmp_path):
    """Each read of rank 0's clock is a broadcast the CPU waits for: one at the start and one per log step, the
    seconds in between counted from the last interval's seconds per step, the same on every rank."""
    from types import SimpleNamespace
    cfg = tiny_config(tmp_path, time_budget_s=30.0)
    cfg = replace(cfg, logger=replace(cfg.logger, log_interval=10))
    reads = []
    procs = SimpleNamespace(distributed=True, from_rank0=lambda value: reads.append(value) or value)
    clock = train_module.BudgetClock(SimpleNamespace(cfg=cfg, procs=procs, start_iter=0), 0.0)
    seconds = [clock.seconds(it, 0.5 * it) for it in range(100)]  # rank 0 trains 0.5 s a step
    assert len(reads) == 1 + 9  # the start, then steps 10, 20, ... 90
    assert seconds[:10] == [0.0] * 10  # nothing measured yet: the first interval counts from the start
    assert seconds[25] == pytest.approx(12.5) and seconds[99] == pytest.approx(49.5)
    alone = train_module.BudgetClock(SimpleNamespace(cfg=cfg, procs=SimpleNamespace(distributed=False), start_iter=0),
                                     0.0)
    assert alone.seconds(7, 3.3) == 3.3  # one process reads its own clock, no collective
