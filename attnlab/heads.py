"""Head scores: what kind of head each attention head of a GPT is, measured on random tokens repeated twice:

- previous-token score: the mean attention weight from each position to the position just before it;
- induction score: the mean weight from each position of the second copy to the token just after that token's
  earlier occurrence, where an induction head (Olsson et al. 2022) looks to copy what came next.

Random tokens leave a head nothing to go on but position and repetition, so a score near 1 says the head does that
nearly always, whatever the text; a head spreading its weight evenly scores about 1/position. scripts/attention.py
labels each head of its page with both.
"""
import torch

SEGMENT = 64  # tokens in the repeated random segment, at most half the model's context (TransformerLens uses 50)
SEQUENCES = 8  # random sequences the scores average over


def repeated_tokens(vocab_size, length, n, generator=None):
    """(n, 2 * length) token ids: n random segments of length tokens, each followed by itself."""
    segment = torch.randint(vocab_size, (n, length), generator=generator)
    return segment.repeat(1, 2)


def previous_token_scores(maps):
    """(n_layer, n_head) mean weight on the previous position, from maps: per layer (B, n_head, T, T)."""
    a = torch.stack(maps, 1).float()  # (B, L, H, T, T)
    return a.diagonal(-1, -2, -1).mean((0, -1))  # the weight of query t on key t - 1, for t >= 1


def induction_scores(maps, length):
    """(n_layer, n_head) mean weight of each second-copy query t (length <= t < 2 * length) on key t - length + 1,
    the token after its earlier occurrence, from maps of repeated_tokens(..., length, ...)."""
    a = torch.stack(maps, 1).float()  # (B, L, H, T, T)
    stripe = a.diagonal(1 - length, -2, -1)  # (B, L, H, T - length + 1): query length - 1 + i on key i
    return stripe[..., 1:].mean((0, -1))  # from query length on: the second copy


@torch.no_grad()
def head_scores(model, seed=0):
    """(previous-token scores, induction scores), each (n_layer, n_head), of a GPT, on SEQUENCES random sequences
    drawn from seed, each a segment of up to SEGMENT tokens repeated."""
    length = min(SEGMENT, model.config.block_size // 2)
    generator = torch.Generator().manual_seed(seed)
    x = repeated_tokens(model.config.vocab_size, length, SEQUENCES, generator)
    maps = model.attention_maps(x.to(next(model.parameters()).device))
    return previous_token_scores(maps), induction_scores(maps, length)
