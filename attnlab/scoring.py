"""Scoring: loss and bits per byte of a model's predictions; over a whole token stream, every token once
(train.py's final_eval=full and scripts/evaluate.py), or over sampled batches (train.py's estimates).

Bits per byte put char-level and BPE models, and other repositories' numbers, on one scale: the nats of the tokens
that cover text, summed, over the UTF-8 bytes they cover, / ln 2. An end-of-text token covers no text (0 bytes) and
is left out of both sums.

The stream is cut into consecutive non-overlapping windows of block_size tokens (the last one shorter); each token
is predicted from the tokens before it in its window, as in training. A window starts afresh (an RNN from a zero
state): a token early in a window sees less context than a sliding window would give it, at block_size times less
compute.
"""
import math
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.loss import CHUNK_LOGITS, chunks_pay
from attnlab.runtime import activation_dtype


def byte_counts(tokenizer, device):
    """(vocab_size,) the UTF-8 bytes each token id covers, on device: what bits per byte divide by."""
    return torch.from_numpy(tokenizer.token_bytes(np.arange(tokenizer.vocab_size))).to(device)


@dataclass
class Tally:
    """Running sums over scored batches."""
    byte_counts: torch.Tensor  # (vocab_size,) from byte_counts()
    nats: float = 0.0  # summed loss of every token
    tokens: int = 0
    text_nats: float = 0.0  # summed loss of the tokens that cover text
    bytes: int = 0

    def add(self, logits, targets, mean_loss):
        """A batch's logits (B, T, vocab), targets (B, T) and the model's mean loss over them."""
        self.nats += mean_loss.item() * targets.numel()
        self.tokens += targets.numel()
        nats = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
        covered = self.byte_counts[targets.flatten()]
        self.text_nats += nats[covered > 0].sum().item()
        self.bytes += int(covered.sum().item())

    @property
    def loss(self):
        return self.nats / self.tokens

    @property
    def bits_per_byte(self):
        return self.text_nats / self.bytes / math.log(2) if self.bytes else math.nan


# logits in one scored piece: its logits and two log-softmaxes of them (the model's loss, the tally's) live at once,
# and half a training step's chunk keeps the three where the allocator reuses memory instead of faulting it in anew
EVAL_LOGITS = {device: logits // 2 for device, logits in CHUNK_LOGITS.items()}


def eval_pieces(device_type, T, vocab_size):
    """(rows, tokens) of one scored piece of windows of T tokens: at most EVAL_LOGITS logits; only the CPU splits a
    row into tokens (through the cache), a GPU keeps whole rows."""
    piece = EVAL_LOGITS["cpu" if device_type == "cpu" else "cuda"]
    rows = max(1, piece // (T * vocab_size))
    if device_type != "cpu":
        return rows, T
    return rows, max(1, piece // (rows * vocab_size))


def score_batch(model, x, y, tally, amp=nullcontext()):
    """Add windows x (B, T) and their targets y to tally; returns their mean loss, a 0-d tensor. Where a training
    step's loss would be chunked (attnlab.loss.chunks_pay), in pieces of at most EVAL_LOGITS logits: a few rows at a
    time, and on the CPU a long row a few tokens at a time through the model's cache, so that no piece outgrows the
    allocator's reuse (the whole (B·T, vocab) logits page-fault in and out at every batch). A GPU splits rows only:
    whole rows keep one shape for a compiled model and need no cache."""
    vocab_size = tally.byte_counts.numel()
    if not chunks_pay(x.device, x.numel(), vocab_size):
        with amp:
            logits, loss = model(x, y)
        tally.add(logits, y, loss)
        return loss
    rows, tokens = eval_pieces(x.device.type, x.size(1), vocab_size)
    total = 0.0
    with amp:
        for x_rows, y_rows in zip(x.split(rows), y.split(rows)):
            cache = None
            if tokens < x.size(1):
                cache = model.new_cache(x_rows.size(0), x.device, activation_dtype(model, x.device))
            for x_piece, y_piece in zip(x_rows.split(tokens, 1), y_rows.split(tokens, 1)):
                logits, loss = model(x_piece, y_piece, cache=cache)
                tally.add(logits, y_piece, loss)
                total += loss.float() * y_piece.numel()
    return total / y.numel()


@torch.no_grad()
def score_stream(model, data, batch_size, block_size, byte_counts, amp=nullcontext()):
    """Yields the running Tally after each batch of windows of data (a 1-D array of ids), for a progress bar; the
    last covers every token after the first."""
    device = byte_counts.device
    ids = torch.from_numpy(np.asarray(data).astype(np.int64))
    n_blocks = (len(ids) - 1) // block_size
    blocks = ids[:n_blocks * block_size + 1].unfold(0, block_size + 1, block_size)  # (n_blocks, T + 1)
    batches = list(blocks.split(batch_size)) + [ids[n_blocks * block_size:][None]]  # the tail, (1, < T + 1)
    tally = Tally(byte_counts)
    for batch in batches:
        if batch.size(1) < 2:
            continue
        score_batch(model, batch[:, :-1].to(device), batch[:, 1:].to(device), tally, amp)
        yield tally


def full_score(model, data, batch_size, block_size, byte_counts, amp=nullcontext()) -> Tally:
    """The Tally of every token of data after the first."""
    tally = None
    for tally in score_stream(model, data, batch_size, block_size, byte_counts, amp):
        pass
    return tally
