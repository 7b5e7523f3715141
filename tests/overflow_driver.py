"""fp16's overflow skip on every process of a group (torchrun, gloo on the CPU), under DDP and FSDP2 with Muon: only
rank 1's gradients overflow; each rank saves whether its weights moved and its new scale for tests/test_distributed.py.

    torchrun --standalone --nproc_per_node=2 -m tests.overflow_driver OUT_DIR   # writes OUT_DIR/rank<r>.pt
"""
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from attnlab.checkpoint import build_model
from attnlab.config import TrainConfig
from attnlab.distributed import Processes, shard
from attnlab.optim import make_optimizer, scaled_step


def whole(t):
    return t.full_tensor() if isinstance(t, DTensor) else t.detach().clone()


def step(parallel, procs):
    """One scaled step in which rank 1 alone finds an inf in its gradients: (weights moved, the scale after)."""
    torch.manual_seed(0)
    model = build_model({"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8, "vocab_size": 16})
    model = shard(model, parallel, procs)
    if parallel == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = make_optimizer(model, TrainConfig(optimizer="muon"), procs.device)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    before = [whole(p) for p in model.parameters()]
    x = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(procs.rank))
    scaler.scale(model(x, x)[1]).backward()
    if procs.rank == 1:  # after the reduction: this rank's gradients (its shards under FSDP2) alone overflow
        grad = next(p for p in model.parameters() if p.grad is not None).grad
        (grad.to_local() if isinstance(grad, DTensor) else grad).view(-1)[0] = float("inf")
    scaled_step(model, optimizer, scaler, grad_clip=1.0, all_max=procs.max_)
    moved = any(not torch.equal(b, whole(p)) for b, p in zip(before, model.parameters()))
    return moved, scaler.get_scale()


def main():
    dist.init_process_group("gloo")
    procs = Processes(torch.device("cpu"), rank=dist.get_rank(), world_size=2, distributed=True)
    results = {parallel: step(parallel, procs) for parallel in ("ddp", "fsdp")}
    torch.save(results, Path(sys.argv[1]) / f"rank{procs.rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
