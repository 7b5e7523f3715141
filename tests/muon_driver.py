"""Muon's steps on every process of a group (torchrun, gloo on the CPU), with DDP's gradients and with FSDP2's
shards, each rank's results saved for tests/test_distributed.py; steps() alone is the one-process reference.

    torchrun --standalone --nproc_per_node=2 -m tests.muon_driver OUT_DIR   # writes OUT_DIR/rank<r>.pt
"""
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from attnlab.optim import Muon

# 3 matrices of (5, 6): a share padded on 2 processes; 5 rows: FSDP2's shards of 3 and 2; wide, tall and square
SHAPES = [(5, 6), (6, 5), (5, 6), (12, 4), (5, 6), (4, 12), (12, 4), (8, 8)]
STEPS = 3


def steps(wrap=lambda weights: weights):
    """Weights and momentum buffers (whole matrices) after STEPS Muon steps on seeded gradients; wrap shards them."""
    generator = torch.Generator().manual_seed(0)
    weights = torch.nn.ParameterList(0.1 * torch.randn(shape, generator=generator) for shape in SHAPES)
    weights = wrap(weights)
    groups = [{"params": list(weights)[:5], "lr_scale": 1.0}, {"params": list(weights)[5:], "lr_scale": 0.5}]
    muon = Muon(groups, lr=0.02, momentum=0.85, weight_decay=0.1, ns_dtype=torch.float32)
    for _ in range(STEPS):
        for w in weights:
            grad = torch.randn(w.shape, generator=generator)  # every process draws the same: DDP's reduced ones
            w.grad = distribute_tensor(grad, w.device_mesh, w.placements) if isinstance(w, DTensor) else grad
        muon.step()

    def whole(t):
        return t.full_tensor() if isinstance(t, DTensor) else t.detach().clone()

    buffers = [muon.state[w]["momentum_buffer"] for w in weights]
    return {"weights": [whole(w) for w in weights], "buffers": [whole(b) for b in buffers]}


def fsdp(weights):
    fully_shard(weights)
    return weights


def main():
    dist.init_process_group("gloo")
    results = {"ddp": steps(), "fsdp": steps(fsdp)}
    torch.save(results, Path(sys.argv[1]) / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
