"""scoring.py: the whole-stream loss scores every token once, from the tokens before it in its block."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig
from scoring import full_loss


def test_full_loss_scores_every_token_once_with_its_block_as_context():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, n_layer=1, n_head=2, n_embd=16, block_size=8))
    data = np.random.default_rng(0).integers(0, 11, 103).astype(np.uint16)  # 12 blocks of 8, then a tail of 6
    seen = []

    class Recorder(torch.nn.Module):
        def forward(self, x, y):
            seen.append(y.flatten())
            return model(x, y)

    loss = full_loss(Recorder(), data, 5, 8, torch.device("cpu"))
    ids = torch.from_numpy(data.astype(np.int64))
    assert torch.equal(torch.cat(seen), ids[1:])
    nll = []  # the reference: each block on its own, every position's loss
    for s in range(0, len(ids) - 1, 8):
        x, y = ids[s:min(s + 8, len(ids) - 1)], ids[s + 1:s + 9]
        nll.append(F.cross_entropy(model(x[None])[0][0], y, reduction="none"))
    assert loss == pytest.approx(torch.cat(nll).mean().item(), rel=1e-5)
