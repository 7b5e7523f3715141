"""The synthetic tasks (multi-query associative recall, induction), the equal-size model pair, and the short training
loop that both models go through."""
from dataclasses import replace

import torch

from checkpoint import build_model
from config import ModelConfig, TrainConfig, compose
from training import get_lr, make_optimizer, set_lr, train_step


def lstm_preset(vocab_size):
    """configs/model/lstm.yaml, the LSTM that matches the default GPT's parameter count."""
    return replace(compose("model=lstm").model, vocab_size=vocab_size)


def rnn_width(target, vocab_size, n_layer=2, gates=4, tied=False):
    """The LSTM (gates=4) or GRU (3) width whose parameter count is closest to target; each layer has
    gates x (W_ih, W_hh, b_ih, b_hh)."""
    count = lambda h: vocab_size * h * (1 if tied else 2) + n_layer * gates * (2 * h * h + 2 * h)
    return min(range(4, 2048), key=lambda h: abs(count(h) - target))


def synthetic_models(vocab_size, seq_len):
    """A 2-layer GPT and the 2-layer LSTM of the same size for the synthetic tasks. One head per layer and an
    untied head: in our runs the 4-head and tied variants sat on the chance plateau for over 1000 steps."""
    gpt = ModelConfig(vocab_size=vocab_size, block_size=seq_len, n_layer=2, n_head=1, n_embd=64, tie_weights=False)
    width = rnn_width(build_model(gpt).num_params(), vocab_size)
    lstm = ModelConfig(type="lstm", vocab_size=vocab_size, block_size=seq_len, n_layer=2, n_embd=width,
                       tie_weights=False)
    return {"gpt": gpt, "lstm": lstm}



def recall_batch(batch_size, n_pairs, n_keys=16, seq_len=64, generator=None):
    """Multi-query associative recall (Zoology; Arora et al. 2023): n_pairs key-value pairs, then every key once
    more in random order, then filler. The target at each query is its key's value; -1 elsewhere. Tokens: 0 filler,
    1..n_keys keys, n_keys+1..2*n_keys values. Queries follow the pairs, as Zoology's power-law placement mostly
    puts them; returns inputs and targets, each (B, seq_len)."""
    if not 0 < n_pairs <= n_keys or 3 * n_pairs > seq_len:
        raise ValueError(f"{n_pairs} pairs need n_keys >= {n_pairs} and seq_len >= {3 * n_pairs}")
    draw = lambda: torch.rand(batch_size, n_keys, generator=generator).argsort(1)[:, :n_pairs] + 1  # distinct
    keys, values = draw(), draw() + n_keys
    x = torch.zeros(batch_size, seq_len, dtype=torch.long)
    x[:, 0:2 * n_pairs:2], x[:, 1:2 * n_pairs:2] = keys, values
    order = torch.rand(batch_size, n_pairs, generator=generator).argsort(1)
    x[:, 2 * n_pairs:3 * n_pairs] = keys.gather(1, order)
    y = torch.full_like(x, -1)
    y[:, 2 * n_pairs:3 * n_pairs] = values.gather(1, order)
    return x, y


def induction_batch(batch_size, vocab_size=33, seq_len=64, min_len=8, generator=None):
    """A segment of min_len..seq_len/2 distinct random tokens (1..vocab_size-1), repeated, then filler 0s. Targets:
    the next token inside the second copy (-1 elsewhere), which only a look-back at the first copy predicts. The
    random length rules out a fixed-offset shortcut; an induction head (Olsson et al. 2022) solves it. Returns
    inputs, targets (B, seq_len) and the segment lengths (B,)."""
    half = seq_len // 2
    lengths = torch.randint(min_len, half + 1, (batch_size, 1), generator=generator)  # (B, 1)
    segment = torch.rand(batch_size, vocab_size - 1, generator=generator).argsort(1)[:, :half] + 1  # (B, half)
    t = torch.arange(seq_len)[None]  # (1, T)
    x = torch.where(t < 2 * lengths, segment.gather(1, (t % lengths).clamp(max=half - 1)), 0)
    y = torch.cat([x[:, 1:], torch.full((batch_size, 1), -1)], dim=1)
    y[(t < lengths) | (t >= 2 * lengths - 1)] = -1
    return x, y, lengths[:, 0]


@torch.no_grad()
def accuracy(model, x, y):
    model.eval()
    predicted = model(x)[0].argmax(-1)
    model.train()
    return (predicted[y >= 0] == y[y >= 0]).float().mean().item()


def train_synthetic(model_cfg, make_batch, steps, lr, evals, device, stop_at=0.995, eval_every=50, seed=0):
    """A short plain loop (train.py's AdamW, warmup + cosine schedule and gradient clipping) on freshly drawn
    batches; make_batch(it, generator) gives (x, y). Stops early once every eval set is at stop_at. Returns the model
    and the curve [(step, {name: accuracy})]."""
    torch.manual_seed(seed)
    model = build_model(model_cfg).to(device)
    train_cfg = TrainConfig(learning_rate=lr, min_lr=lr / 10, max_iters=steps, warmup_iters=50)
    optimizer = make_optimizer(model, train_cfg, device)
    generator = torch.Generator().manual_seed(seed + 1)
    evals = {name: (x.to(device), y.to(device)) for name, (x, y) in evals.items()}
    curve = []
    for it in range(steps + 1):
        if it % eval_every == 0 or it == steps:
            curve.append((it, {name: accuracy(model, x, y) for name, (x, y) in evals.items()}))
            if it == steps or min(curve[-1][1].values()) >= stop_at:
                break
        set_lr(optimizer, get_lr(it, train_cfg))
        x, y = make_batch(it, generator)
        train_step(model, optimizer, [(x.to(device), y.to(device))], grad_clip=train_cfg.grad_clip)
    return model.eval(), curve

