"""The synthetic tasks (multi-query associative recall, induction), the equal-size models (GPT, LSTM, minGRU), the
bytes of state each carries, and the short training loop every model goes through. Tuning lives in protocol.py."""
import math
import time
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from tqdm import tqdm

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig, TrainConfig, compose
from attnlab.optim import get_lr, make_optimizer, set_lr, train_step
from attnlab.rnn import mingru_params

IMPROVING = 0.01  # "still improving at the cap": the selection loss fell by more than this fraction in the last quarter


def lstm_preset(vocab_size):
    """configs/model/lstm.yaml, the LSTM that matches the default GPT's parameter count."""
    return replace(compose("model=lstm").model, vocab_size=vocab_size)


def rnn_width(target, vocab_size, n_layer=2, gates=4, tied=False):
    """The LSTM (gates=4) or GRU (3) width whose parameter count is closest to target; each layer has
    gates x (W_ih, W_hh, b_ih, b_hh)."""
    def count(h):
        return vocab_size * h * (1 if tied else 2) + n_layer * gates * (2 * h * h + 2 * h)
    return min(range(4, 2048), key=lambda h: abs(count(h) - target))


def mingru_width(target, vocab_size, n_layer=2, tied=False):
    """The minGRU width whose parameter count (attnlab/rnn.py's mingru_params) is closest to target."""
    return min(range(4, 2048), key=lambda h: abs(mingru_params(h, vocab_size, n_layer, tied) - target))


def synthetic_models(vocab_size, seq_len, n_embd=64):
    """A 2-layer GPT of width n_embd and the 2-layer LSTM and minGRU of the same parameter count, for the synthetic
    tasks. One head per layer and an untied head: the 4-head and tied variants stay far longer on the chance plateau
    (docs/log.md)."""
    gpt = ModelConfig(vocab_size=vocab_size, block_size=seq_len, n_layer=2, n_head=1, n_embd=n_embd,
                      tie_weights=False)
    n_params = build_model(gpt).num_params()
    widths = {"lstm": rnn_width(n_params, vocab_size), "mingru": mingru_width(n_params, vocab_size)}
    return {"gpt": gpt, **{name: replace(gpt, type=name, n_embd=width) for name, width in widths.items()}}


def state_bytes(cfg, seq_len):
    """Bytes of state a model carries per sequence after seq_len tokens, in fp32: a GPT's KV cache (K and V of every
    layer and token), an LSTM's h and c of every layer, or a GRU's or minGRU's h of every layer (n_layer x n_embd
    x 4 B); a recurrent state does not grow with seq_len."""
    arch = cfg.architecture()
    if cfg.type == "gpt":
        return 2 * arch.n_layer * arch.kv_heads * arch.head_size * seq_len * 4
    return arch.n_layer * (2 if cfg.type == "lstm" else 1) * arch.n_embd * 4


def recall_batch(batch_size, n_pairs, n_keys=64, seq_len=None, generator=None):
    """Multi-query associative recall (Zoology; Arora et al. 2023): n_pairs key-value pairs (distinct keys, distinct
    values), then every key once more in random order, then filler up to seq_len (default 3 * n_pairs: none). The
    target at each query is its key's value; -1 elsewhere. Tokens: 0 filler, 1..n_keys keys, n_keys+1..2*n_keys
    values, so a guess among the values present scores 1/n_pairs. Queries follow the pairs, as Zoology's power-law
    placement mostly puts them; returns inputs and targets, each (B, seq_len)."""
    seq_len = seq_len or 3 * n_pairs
    if not 0 < n_pairs <= n_keys or 3 * n_pairs > seq_len:
        raise ValueError(f"{n_pairs} pairs need n_keys >= {n_pairs} and seq_len >= {3 * n_pairs}")
    def draw():
        return torch.rand(batch_size, n_keys, generator=generator).argsort(1)[:, :n_pairs] + 1  # distinct
    keys, values = draw(), draw() + n_keys
    x = torch.zeros(batch_size, seq_len, dtype=torch.long)
    x[:, 0:2 * n_pairs:2], x[:, 1:2 * n_pairs:2] = keys, values
    order = torch.rand(batch_size, n_pairs, generator=generator).argsort(1)
    x[:, 2 * n_pairs:3 * n_pairs] = keys.gather(1, order)
    y = torch.full_like(x, -1)
    y[:, 2 * n_pairs:3 * n_pairs] = values.gather(1, order)
    return x, y


def mixed_recall_batch(batch_size, fewest, most, n_keys=64, generator=None):
    """A recall batch whose number of pairs is drawn log-uniformly from fewest..most: as many batches with 4-8 pairs
    as with 32-64, so the short ones, where the look-up forms first, teach both models alike (no curriculum)."""
    n = round(2 ** (math.log2(fewest) + torch.rand(1, generator=generator).item() * math.log2(most / fewest)))
    return recall_batch(batch_size, n, n_keys, generator=generator)


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


def unseen_chance(lengths):
    """Induction's informed chance: the accuracy on the second copy of a model that knows the segment's tokens but not
    their order, so guesses uniformly among those not yet seen in the second copy. Inside a copy of S tokens the j-th
    scored position (j = 0..S-2) has S-1-j of them left, so a sequence scores H(S-1) hits out of S-1; pooled over
    the sequences of lengths (as task_scores pools positions)."""
    hits = sum(sum(1 / k for k in range(1, S)) for S in lengths)
    return hits / sum(S - 1 for S in lengths)


@torch.no_grad()
def task_scores(model, x, y):
    """Accuracy and mean cross-entropy over the scored positions (targets >= 0)."""
    model.eval()
    logits = model(x)[0][y >= 0]  # (scored positions, vocab)
    model.train()
    return (logits.argmax(-1) == y[y >= 0]).float().mean().item(), F.cross_entropy(logits, y[y >= 0]).item()


@dataclass
class TaskRun:
    """One trained configuration: the model as training left it, the curve [(step, {eval set: accuracy})], the steps
    and seconds it took, its mean accuracy over the eval sets at the end, whether it reached stop_at on every eval
    set, whether it was still improving when the cap stopped it, and (filled by its caller) its test accuracies."""
    model: torch.nn.Module
    curve: list
    steps: int
    seconds: float
    select: float
    solved: bool
    improving: bool
    test: dict = field(default_factory=dict)
    chosen_on: tuple = ()  # the eval sets select averages (empty: every set in the curve)


def steps_to(run, level=0.9, sets=None):
    """The first scored step at which every one of sets (default: the sets the run is chosen on) reached level, from
    the curve; None if it never did."""
    sets = sets or run.chosen_on
    return next((step for step, accs in run.curve
                 if min(v for k, v in accs.items() if not sets or k in sets) >= level), None)


def still_improving(losses, steps):
    """losses [(step, summed selection loss)]: did the loss fall by more than IMPROVING over the last quarter?"""
    before = [loss for step, loss in losses if step <= 3 * steps / 4][-1]
    return losses[-1][1] < (1 - IMPROVING) * before


def train_synthetic(model_cfg, make_batch, steps, lr, evals, device, stop_at=0.99, eval_every=50, seed=0,
                    desc="train", optimizer="muon", muon_lr=0.02, tracked=None):
    """A short plain loop (train.py's optimizers, warmup + cosine schedule to the cap `steps` and gradient
    clipping) on freshly drawn batches; make_batch(it, generator) gives (x, y). Every eval_every steps it scores the
    eval sets and the tracked ones (a test set whose curve is reported, never chosen on: it is in the curve but not
    in select); it stops early only once every one is at stop_at (solved), so every unsolved run gets the whole cap,
    whatever its model. At the cap it records whether the summed selection loss was still falling (still_improving)."""
    torch.manual_seed(seed)
    model = build_model(model_cfg).to(device)
    # optimizer="muon": Muon at muon_lr on the hidden matrices, AdamW at lr on the rest; "adamw": AdamW at lr on all.
    # fp32 (the loop never autocasts), so Muon's iterations are fp32 on every CPU, not bf16 where it is native
    train_cfg = TrainConfig(optimizer=optimizer, learning_rate=lr, min_lr=lr / 10, muon_lr=muon_lr, max_iters=steps,
                            warmup_iters=min(50, steps // 10), dtype="float32")
    optim = make_optimizer(model, train_cfg, device)
    generator = torch.Generator().manual_seed(seed + 1)
    chosen_on = list(evals)
    evals = {name: (x.to(device), y.to(device)) for name, (x, y) in {**evals, **(tracked or {})}.items()}
    curve, losses, start = [], [], time.time()
    for it in tqdm(range(steps + 1), desc=desc, leave=False):
        if it % eval_every == 0 or it == steps:
            scored = {name: task_scores(model, x, y) for name, (x, y) in evals.items()}
            curve.append((it, {name: acc for name, (acc, _) in scored.items()}))
            losses.append((it, sum(scored[name][1] for name in chosen_on)))
            solved = min(curve[-1][1].values()) >= stop_at
            if it == steps or solved:
                break
        set_lr(optim, get_lr(it, train_cfg))
        x, y = make_batch(it, generator)
        train_step(model, optim, [(x.to(device), y.to(device))], grad_clip=train_cfg.grad_clip)
    select = sum(curve[-1][1][name] for name in chosen_on) / len(chosen_on)
    improving = not solved and still_improving(losses, steps)
    return TaskRun(model.eval(), curve, it, time.time() - start, select, solved, improving, chosen_on=tuple(chosen_on))
