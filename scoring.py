"""Scoring a model on a whole token stream, every token once: train.py's final_eval=full and evaluate.py.

The stream is cut into consecutive non-overlapping windows of block_size tokens (the last one shorter); each token
is predicted from the tokens before it in its window, as in training. A window starts afresh (an RNN from a zero
state): a token early in a window sees less context than a sliding window would give it, at block_size times less
compute.
"""
from contextlib import nullcontext

import numpy as np
import torch


@torch.no_grad()
def window_losses(model, data, batch_size, block_size, device, amp=nullcontext()):
    """Yields (summed loss in nats, tokens predicted) for each batch of windows of data, a 1-D array of ids."""
    ids = torch.from_numpy(np.asarray(data).astype(np.int64))
    n_blocks = (len(ids) - 1) // block_size
    blocks = ids[:n_blocks * block_size + 1].unfold(0, block_size + 1, block_size)  # (n_blocks, T + 1)
    batches = list(blocks.split(batch_size)) + [ids[n_blocks * block_size:][None]]  # the tail, (1, < T + 1)
    for batch in batches:
        if batch.size(1) < 2:
            continue
        with amp:
            loss = model(batch[:, :-1].to(device), batch[:, 1:].to(device))[1]
        yield loss.item() * batch[:, 1:].numel(), batch[:, 1:].numel()


def full_loss(model, data, batch_size, block_size, device, amp=nullcontext()):
    """Mean loss in nats over every token of data after the first."""
    return sum(nats for nats, _ in window_losses(model, data, batch_size, block_size, device, amp)) / (len(data) - 1)
