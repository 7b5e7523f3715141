"""attnlab/scoring.py: the whole-stream score covers every token once, from the tokens before it in its block; bits per
byte leave out tokens that cover no text."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.scoring import full_score
from model import GPT, GPTConfig


def test_full_score_covers_every_token_once_with_its_block_as_context():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, n_layer=1, n_head=2, n_embd=16, block_size=8))
    data = np.random.default_rng(0).integers(0, 11, 103).astype(np.uint16)  # 12 blocks of 8, then a tail of 6
    counts = torch.tensor([0, 1, 1, 2, 2, 3, 1, 1, 4, 1, 1])  # token 0 (an end-of-text token) covers no text
    seen = []

    class Recorder(torch.nn.Module):
        def forward(self, x, y):
            seen.append(y.flatten())
            return model(x, y)

    tally = full_score(Recorder(), data, 5, 8, counts)
    ids = torch.from_numpy(data.astype(np.int64))
    assert torch.equal(torch.cat(seen), ids[1:])
    nll = []  # the reference: each block on its own, every position's loss
    for s in range(0, len(ids) - 1, 8):
        x, y = ids[s:min(s + 8, len(ids) - 1)], ids[s + 1:s + 9]
        nll.append(F.cross_entropy(model(x[None])[0][0], y, reduction="none"))
    nll = torch.cat(nll)
    assert tally.tokens == len(ids) - 1 and tally.loss == pytest.approx(nll.mean().item(), rel=1e-5)
    text = counts[ids[1:]] > 0
    assert tally.bytes == counts[ids[1:]].sum().item() and not text.all()
    assert tally.bits_per_byte == pytest.approx(nll[text].sum().item() / tally.bytes / math.log(2), rel=1e-5)
