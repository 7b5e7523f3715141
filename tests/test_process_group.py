"""The process group as a GPU run meets it: the corpus prepared before any collective starts (gloo, with a
preparation slower than the group's timeout), and DDP compiled from outside, as PyTorch advises."""
import pytest
import torch
import torch.distributed as dist
from conftest import data_overrides, run_script
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing._internal.distributed.fake_pg import FakeStore

from attnlab.distributed import Processes, wrap
from model import GPT, GPTConfig

TINY = ["data=text", "model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16",
        "train.batch_size=2", "train.max_iters=2", "train.eval_iters=1", "train.device=cpu", "train.dtype=float32"]


@pytest.mark.slow  # two processes, one of which prepares the corpus for 6 s
def test_a_preparation_longer_than_the_group_timeout_does_not_time_it_out(tmp_path, one_thread):
    result = run_script("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "-m", "tests.slow_prepare_driver", "6", *TINY, *data_overrides(tmp_path),
                        f"out_dir={tmp_path / 'run'}", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "run" / "ckpt.pt").exists()


@pytest.fixture
def fake_group():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield Processes(torch.device("cpu"), rank=0, world_size=2, distributed=True)
    dist.destroy_process_group()


def test_ddp_is_compiled_from_outside_and_evaluation_skips_it(fake_group):
    model = GPT(GPTConfig(vocab_size=17, block_size=8, n_layer=1, n_head=2, n_embd=16))
    step_model, eval_model = wrap(model, True, fake_group)
    assert isinstance(step_model, torch._dynamo.eval_frame.OptimizedModule)
    assert isinstance(step_model._orig_mod, DDP) and step_model._orig_mod.module is model
    assert isinstance(eval_model, torch._dynamo.eval_frame.OptimizedModule) and eval_model._orig_mod is model
    assert torch._dynamo.config.optimize_ddp  # dynamo splits the compiled graph at DDP's buckets
    step_model, eval_model = wrap(model, False, fake_group)
    assert isinstance(step_model, DDP) and eval_model is model
