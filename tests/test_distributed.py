"""Two processes (torchrun, gloo on CPU) train like one: one out_dir, one checkpoint, the same parameters on every
rank, the losses and weights of a single process with the same global batch, and an exact resume; under DDP and
under FSDP (train.parallel=fsdp), whose checkpoints are a single process's and resume in either mode. Tiny models."""
import json
import re
import shutil
from contextlib import contextmanager

import muon_driver
import pytest
import torch
import torch.distributed as dist
from conftest import compose, data_overrides, run_in_process, run_script
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.distributed.fake_pg import FakeStore

from attnlab.checkpoint import build_model
from attnlab.config import TrainConfig
from attnlab.distributed import Processes, shard
from attnlab.optim import make_optimizer
from attnlab.record import read_metrics
from train import train

# A constant learning rate (no warmup, min_lr = learning_rate), so a 4-step run resumed to 8 steps is a straight 8-step
# run; tokens_per_step = 2 processes x batch_size 4 x block_size 16, so one process takes 2 micro-steps per step.
ARGS = ["data=text", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=16",
        "train.batch_size=4", "train.tokens_per_step=128", "train.warmup_iters=0", "train.learning_rate=1e-3",
        "train.min_lr=1e-3", "train.eval_interval=1000", "train.eval_iters=1", "train.device=cpu",
        "train.dtype=float32", "train.optimizer=adamw", "logger.log_interval=1"]
# Observed: 0 for both (gloo, CPU), under DDP and FSDP alike (weights 7e-9 once, FSDP resuming a one-process run).
# Halving is exact in floating point, so averaging 2 processes' gradients equals accumulating 2 micro-steps of
# loss / 2; the tolerances leave room for other reduction orders. The weights' is an absolute difference after 8 AdamW
# steps of lr 1e-3: a diverging run would differ by ~1e-3 per step.
LOSS_TOLERANCE = 1e-6
WEIGHT_TOLERANCE = 1e-6


def torchrun(*args):
    result = run_script("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_two_processes_train_like_one_with_the_same_global_batch_and_resume(tmp_path, one_thread):
    args = [*ARGS, *data_overrides(tmp_path)]
    train(compose(*args, "train.max_iters=8", f"out_dir={tmp_path / 'one'}"))  # one process, 2 micro-steps of 4

    ddp = tmp_path / "ddp"
    first = torchrun("train.py", *args, "train.max_iters=4", f"out_dir={ddp}")  # the CLI, 2 x 1 micro-step
    assert "2 process(es)" in first and "1 micro-step(s)" in first
    assert sorted(p.name for p in ddp.iterdir()) == [".hydra", "best.pt", "ckpt.pt", "config.json", "loss.png",
                                                    "metrics.jsonl", "status.json"]  # rank 0 alone writes: one of each
    assert json.loads((ddp / "status.json").read_text())["status"] == "finished"
    resumed = torchrun("-m", "tests.ddp_driver", *args, "train.max_iters=8", "train.resume=true", f"out_dir={ddp}")
    assert f"resuming from {ddp / 'ckpt.pt'} at iter 4" in resumed
    # 64 hex digits, not up to the newline: the two ranks' lines can reach the pipe interleaved
    digests = dict(re.findall(r"rank (\d) parameter sha256: ([0-9a-f]{64})", resumed))
    assert sorted(digests) == ["0", "1"] and digests["0"] == digests["1"]

    one, two = read_metrics(tmp_path / "one", "log"), read_metrics(ddp, "log")
    assert [r["iter"] for r in two] == [r["iter"] for r in one] == list(range(1, 9))
    loss_difference = max(abs(a["train_loss"] - b["train_loss"]) for a, b in zip(one, two))
    weights = [torch.load(d / "ckpt.pt", weights_only=True)["model"] for d in (tmp_path / "one", ddp)]
    assert weights[0].keys() == weights[1].keys()
    weight_difference = max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0])
    print(f"\nmax |loss(1 process) - loss(2 processes)| = {loss_difference:.2e}, max |weight difference| = "
          f"{weight_difference:.2e}")
    assert loss_difference <= LOSS_TOLERANCE
    assert weight_difference <= WEIGHT_TOLERANCE


def loss_difference(run, reference):
    """Max |train loss difference| over the steps run logged, all of which the reference logged too."""
    losses = {r["iter"]: r["train_loss"] for r in read_metrics(reference, "log")}
    logged = read_metrics(run, "log")
    assert logged and all(r["iter"] in losses for r in logged)
    return max(abs(r["train_loss"] - losses[r["iter"]]) for r in logged)


def weight_difference(a, b):
    """Max |difference| of two state dicts with the same keys."""
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def assert_same_optimizer_layout(state, reference):
    """The optimizer state of a checkpoint numbered and grouped as the reference's (a list of them under Muon)."""
    def groups(s):  # a state loaded through torch.distributed.checkpoint has its betas as a list, not a tuple
        return [{k: list(v) if isinstance(v, tuple) else v for k, v in group.items()} for group in s["param_groups"]]

    for a, b in zip(*(s if isinstance(s, list) else [s] for s in (state, reference)), strict=True):
        assert groups(a) == groups(b) and a["state"].keys() == b["state"].keys()
        assert all(x.keys() == y.keys() for x, y in zip(a["state"].values(), b["state"].values()))


@pytest.mark.slow
def test_fsdp_trains_like_one_process_and_its_checkpoints_resume_in_either_mode(tmp_path, one_thread):
    args = [*ARGS, *data_overrides(tmp_path)]
    one, one_at_4, fsdp = tmp_path / "one", tmp_path / "one_to_fsdp", tmp_path / "fsdp"
    train(compose(*args, "train.max_iters=8", f"out_dir={one}"))  # the reference: one process, 2 micro-steps of 4
    train(compose(*args, "train.max_iters=4", f"out_dir={one_at_4}"))
    plain = torch.load(one_at_4 / "ckpt.pt", weights_only=True)

    first = torchrun("train.py", *args, "train.parallel=fsdp", "train.max_iters=4", f"out_dir={fsdp}")
    assert "2 process(es)" in first and "1 micro-step(s)" in first
    ckpt = torch.load(fsdp / "ckpt.pt", weights_only=True)  # plain data: no DTensor could load here
    assert ckpt["model"].keys() == plain["model"].keys()  # the names of one process's model: no _orig_mod., no FSDP
    assert all(type(t) is torch.Tensor and t.device.type == "cpu" for t in ckpt["model"].values())
    assert ckpt["model"]["lm_head.weight"].data_ptr() == ckpt["model"]["transformer.wte.weight"].data_ptr()  # tied
    assert_same_optimizer_layout(ckpt["optimizer"], plain["optimizer"])
    at_4 = [weight_difference(ckpt["model"], plain["model"]), max(weight_difference(a, plain["optimizer"]["state"][i])
            for i, a in ckpt["optimizer"]["state"].items())]  # the weights and the optimizer's moments after step 4

    fsdp_to_one = tmp_path / "fsdp_to_one"
    shutil.copytree(fsdp, fsdp_to_one)
    train(compose(*args, "train.max_iters=8", "train.resume=true", f"out_dir={fsdp_to_one}"))
    resumed = torchrun("train.py", *args, "train.parallel=fsdp", "train.max_iters=8", "train.resume=true",
                       f"out_dir={one_at_4}")
    assert f"resuming from {one_at_4 / 'ckpt.pt'} at iter 4" in resumed
    losses = [loss_difference(run, one) for run in (fsdp, fsdp_to_one, one_at_4)]
    final = torch.load(one / "ckpt.pt", weights_only=True)["model"]
    at_8 = [weight_difference(torch.load(run / "ckpt.pt", weights_only=True)["model"], final)
            for run in (fsdp_to_one, one_at_4)]
    print(f"\nFSDP vs one process: max |loss difference| {losses[0]:.2e} (4 steps), {losses[1]:.2e} (resumed under one "
          f"process), {losses[2]:.2e} (one process's checkpoint resumed under FSDP); max |weight difference| "
          f"{at_4[0]:.2e} (iter 4), {at_8[0]:.2e} and {at_8[1]:.2e} (iter 8, the resumed runs); max |optimizer "
          f"state difference| {at_4[1]:.2e} (iter 4)")
    assert max(losses) <= LOSS_TOLERANCE
    assert max(at_4 + at_8) <= WEIGHT_TOLERANCE

    code, sampled, err = run_in_process("sample.py", f"out_dir={fsdp}", "prompt=the", "max_new_tokens=20", "device=cpu")
    assert code == 0 and sampled.startswith("the") and len(sampled) > 20, err


# Under FSDP each process gathers whole matrices for its share of Newton-Schulz, as one process computes them: observed
# loss 0 and update 1.1e-4 (gloo, CPU, fp32): the FSDP gradient's last bits (2e-9) differ, and the iterations on the
# Gram matrix (optim.gram_iterations) carry that further than x's did (0). Each shard orthogonalised alone: 40-70%.
MUON_LOSS_TOLERANCE = 1e-6
MUON_UPDATE_TOLERANCE = 1e-3


@pytest.mark.slow
def test_muon_under_fsdp_resumes_and_trains_like_one_process(tmp_path, one_thread):
    args = [*ARGS, *data_overrides(tmp_path), "train.optimizer=muon"]
    one, fsdp = tmp_path / "one", tmp_path / "fsdp"
    train(cfg := compose(*args, "train.max_iters=4", f"out_dir={one}"))
    train(compose(*args, "train.max_iters=2", f"out_dir={fsdp}"))  # then 2 steps under FSDP, from Muon's state
    torchrun("train.py", *args, "train.parallel=fsdp", "train.max_iters=4", "train.resume=true", f"out_dir={fsdp}")
    losses = loss_difference(fsdp, one)
    plain, sharded = (torch.load(d / "ckpt.pt", weights_only=True) for d in (one, fsdp))
    assert_same_optimizer_layout(sharded["optimizer"], plain["optimizer"])
    torch.manual_seed(cfg.train.seed)  # train()'s initial weights
    initial = build_model(plain["model_config"]).state_dict()
    update_difference = max(((sharded["model"][k] - plain["model"][k]).norm() / (plain["model"][k] - v).norm()).item()
                            for k, v in initial.items())
    print(f"\nMuon, FSDP vs one process: max |loss difference| {losses:.2e}, largest relative difference of a "
          f"weight's change {update_difference:.3f}")
    assert losses <= MUON_LOSS_TOLERANCE
    assert update_difference <= MUON_UPDATE_TOLERANCE


def test_parallel_is_ddp_or_fsdp_and_one_process_shards_nothing():
    with pytest.raises(ValueError, match="train.parallel='zero' is unknown; use one of ddp, fsdp"):
        TrainConfig(parallel="zero")
    model = build_model({"n_layer": 1, "n_head": 1, "n_embd": 8, "block_size": 8, "vocab_size": 10})
    assert shard(model, "fsdp", Processes(torch.device("cpu"))) is model
    assert all(type(p) is torch.nn.Parameter for p in model.parameters())


@contextmanager
def fake_processes(world_size):
    """This process as rank 0 of world_size on a fake process group: collectives are recorded, never run (what they
    return is garbage), so one process shows what each rank of a large run issues."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield Processes(torch.device("cpu"), rank=0, world_size=world_size, distributed=True)
    finally:
        dist.destroy_process_group()


# GPT-2's blocks: 4 matrices each, (3C, C), (C, C), (4C, C), (C, 4C)
GPT2_SHAPED = {"n_layer": 3, "n_head": 2, "n_embd": 32, "block_size": 8, "vocab_size": 16}


@pytest.mark.parametrize("world_size", [2, 8])
@pytest.mark.parametrize("parallel, collective, per_shape", [("ddp", torch.ops.c10d._allgather_base_, 1),
                                                              ("fsdp", torch.ops.c10d.alltoall_base_, 2)])
def test_a_muon_step_takes_one_or_two_collectives_per_shape_not_a_dozen_per_matrix(world_size, parallel, collective,
                                                                                   per_shape):
    with fake_processes(world_size) as procs:
        model = shard(build_model(GPT2_SHAPED), parallel, procs)
        _, muon = make_optimizer(model, TrainConfig(optimizer="muon"), torch.device("cpu")).optimizers
        matrices = [p for g in muon.param_groups for p in g["params"]]
        for p in matrices:
            p.grad = torch.ones_like(p)  # under FSDP a DTensor of shards, as backward leaves it
        muon.step()  # the first step makes the momentum buffers
        with CommDebugMode() as comm:
            muon.step()
    shapes = {p.shape for p in matrices}
    assert len(matrices) == 12 and len(shapes) == 4
    # each rank orthogonalises 1/world_size of each shape's matrices: DDP all-gathers the results; FSDP2 gathers its
    # share's shards into whole matrices and sends each rank its shards back, two all-to-alls (DTensor's own
    # redistribution costs many collectives a matrix: docs/scale.md)
    assert comm.get_comm_counts() == {collective: per_shape * len(shapes)}


@pytest.mark.parametrize("dtype, gathered", [(torch.bfloat16, torch.bfloat16), (None, torch.float32)])
def test_fsdp_gathers_the_blocks_bf16_parameters_and_reduces_fp32_gradients_in_a_bf16_run_only(dtype, gathered):
    with fake_processes(2) as procs:
        model = shard(build_model(GPT2_SHAPED), "fsdp", procs, dtype)
        blocks = list(model.transformer.h)
        policies = {m._get_fsdp_state()._mp_policy for m in blocks}  # FSDP2 keeps no public record of it
        root = model._get_fsdp_state()._mp_policy
        for m in [*blocks, model]:
            m.unshard()
        assert {p.dtype for b in blocks for p in b.parameters()} == {gathered}  # what forward and backward see
        assert model.transformer.wte.weight.dtype == torch.float32  # the root (embeddings, head) stays fp32
        for m in [*blocks, model]:
            m.reshard()
        assert {p.dtype for p in model.parameters()} == {torch.float32}  # the shards the optimizer steps
    reduced = torch.float32 if dtype == torch.bfloat16 else None  # None: in the parameters' dtype, fp32
    assert [(p.param_dtype, p.reduce_dtype) for p in policies] == [(dtype, reduced)]
    assert (root.param_dtype, root.reduce_dtype) == (None, None)


def test_under_fsdp_in_bf16_the_residual_stream_is_fp32_as_in_one_process():
    """The embedding's output is the residual stream each block adds to: FSDP2 casting the root's parameters or the
    blocks' inputs to bf16 would train the same config in other numerics than one process or DDP."""
    def residual_dtypes(model):
        seen = []
        for block in model.transformer.h:
            block.register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
        with torch.autocast("cpu", torch.bfloat16):
            model(torch.zeros(2, 8, dtype=torch.long))
        return seen
    one = residual_dtypes(build_model(GPT2_SHAPED))
    with fake_processes(2) as procs:
        sharded = residual_dtypes(shard(build_model(GPT2_SHAPED), "fsdp", procs, torch.bfloat16))
    assert one == sharded == [torch.float32] * 3


# Observed 0 (gloo, CPU): every process orthogonalises whole matrices, as one process does. A matrix orthogonalised in
# shards, or a share misplaced, is off by a whole step (~1e-2).
MUON_SHARE_TOLERANCE = 1e-6


def test_muon_under_ddp_and_fsdp_on_two_processes_steps_as_one_process(tmp_path):
    torchrun("-m", "tests.muon_driver", str(tmp_path))
    one = muon_driver.steps()
    for rank in (0, 1):
        results = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for parallel in ("ddp", "fsdp"):
            for kind in ("weights", "buffers"):
                difference = max((a - b).abs().max().item() for a, b in zip(results[parallel][kind], one[kind]))
                assert difference <= MUON_SHARE_TOLERANCE, (rank, parallel, kind)


def test_fp16_skips_on_every_rank_when_one_ranks_gradients_overflow(tmp_path):
    """A rank that skipped alone would leave the others waiting in Muon's collectives: torchrun's timeout is the hang
    this guards against, and both ranks must skip and halve the scale alike."""
    torchrun("-m", "tests.overflow_driver", str(tmp_path))
    for rank in (0, 1):
        results = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert results == {"ddp": (False, 512.0), "fsdp": (False, 512.0)}, rank


def test_ddp_wraps_on_the_processs_own_gpu():
    from attnlab.distributed import ddp_device_ids
    assert ddp_device_ids(torch.device("cuda", 1)) == [1] and ddp_device_ids(torch.device("cuda")) == [0]
    assert ddp_device_ids(torch.device("cpu")) is None
