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


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_loop_reads_the_device_at_log_steps_only(tmp_path, monkeypatch, optimizer):
    cfg = tiny_config(tmp_path, max_iters=200, eval_interval=1000, optimizer=optimizer)
    cfg = replace(cfg, logger=replace(cfg.logger, log_interval=1000))
    reads = HostReads(monkeypatch)
    monkeypatch.setattr(train_module, "evaluate", reads.paused(train_module.evaluate))  # evaluation is not a step
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
