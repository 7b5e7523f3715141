"""The training batches: random windows of a token array (a prepared split's memmap), copied to the device once per
micro-batch. train.py draws every step's micro-batches here; the GPU check (scripts/bench.py) times the same path."""
import numpy as np
import torch

from attnlab.runtime import to_device


def get_batch(data, batch_size, block_size, generator, device):
    """batch_size random windows of data: inputs x (B, T) and targets y = x shifted left by one."""
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator).numpy()
    rows = data[starts[:, None] + np.arange(block_size + 1)]  # (B, T + 1), one gather from the memmap
    batch = to_device(torch.from_numpy(rows.astype(np.int64)), device)  # one contiguous copy (pinned on CUDA)
    return batch[:, :-1], batch[:, 1:]  # sliced where they are used: a strided view would copy through pageable memory


def micro_batches(data, it, cfg, procs, grad_accum):
    """This process's micro-batches of step it. Micro-batch k depends only on (seed, it, k), k counted across
    ranks: a resumed run draws the same data, and 2 processes x 1 micro-step see the batches of 1 x 2."""
    generator = torch.Generator()
    n = procs.world_size * grad_accum
    batches = []
    for k in range(procs.rank * grad_accum, (procs.rank + 1) * grad_accum):
        generator.manual_seed((cfg.train.seed * 1_000_003 + it) * n + k)
        batches.append(get_batch(data, cfg.train.batch_size, cfg.model.block_size, generator, procs.device))
    return batches
