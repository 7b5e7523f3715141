"""Recurrent language models (LSTM, GRU, minGRU) with GPT's interface: the baseline that attention replaced.

Pure PyTorch: token embedding -> n_layer LSTM, GRU or minGRU layers of width n_embd -> linear head. train.py trains it
(model=lstm, model=gru, model=mingru) and attnlab/decode.py generates from it like a GPT (model.py's docstring lists
the interface). Where GPT keeps a KV cache that grows with the context, an RNN carries a fixed-size state: O(1) memory
and time per generated token, but T sequential steps to read T tokens (scripts/report measures both sides). minGRU's
gates read the input only, so it reads T tokens with a parallel scan instead (RNN.scan switches it to T steps).
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab.decode import generate
from attnlab.runtime import native_bf16
from model import RMSNorm, lm_loss, require

TYPES = ("lstm", "gru", "mingru")


@dataclass
class RNNConfig:
    """The fields an RNN reads; config.ModelConfig holds their defaults and configs/model/lstm.yaml a preset."""
    type: str  # lstm | gru | mingru
    vocab_size: int  # tokens in the vocabulary (set from the prepared corpus)
    block_size: int  # training window in tokens (truncated backpropagation through time)
    n_layer: int  # stacked recurrent layers
    n_embd: int  # embedding and state width
    dropout: float  # between layers and before the head
    tie_weights: bool  # share the token embedding with the output head

    def __post_init__(self):
        require(self.type in TYPES, f"type={self.type!r} is not a recurrent model; use lstm, gru or mingru")
        for name in ("vocab_size", "block_size", "n_layer", "n_embd"):
            require(getattr(self, name) > 0, f"{name}={getattr(self, name)} must be positive")
        require(0.0 <= self.dropout < 1.0, f"dropout={self.dropout} must be in [0, 1)")


class RNNState:
    """Every layer's recurrent state: (h, c) for an LSTM, h for a (min)GRU, each (n_layer, B, n_embd). Unlike a KVCache
    its size does not depend on how many tokens it has read."""

    def __init__(self):
        self.clear()

    def clear(self):
        self.value = None  # None until the first token: PyTorch then starts from zeros
        self.length = 0  # tokens read so far

    @property
    def nbytes(self):
        tensors = self.value if isinstance(self.value, tuple) else [self.value] if self.value is not None else []
        return sum(t.nbytes for t in tensors)


def g(x):
    """minGRU's activation on the candidate state (Feng et al. 2024): x + 1/2 above zero, sigmoid below; positive, so
    every h is positive and has a logarithm."""
    return torch.where(x >= 0, x + 0.5, torch.sigmoid(x))


def log_g(x):
    """log g(x), computed in log space below zero; relu keeps the unused branch's log finite, so no nan gradient."""
    return torch.where(x >= 0, (F.relu(x) + 0.5).log(), -F.softplus(-x))


def parallel_scan_log(log_a, log_b, h0):
    """Every h_t = a_t h_{t-1} + b_t at once from log a, log b (B, T, C) and h0 (B, C) or None (zeros): Heinsen's
    log-space scan (2023), h_t = exp(a*_t + logcumsumexp_{s<=t}(log b_s - a*_s)) with a*_t = sum_{s<=t} log a_s.
    A nonzero h0 enters as the term b_0 of an extra first step, with a_0 = 1."""
    if h0 is not None:
        log_a = F.pad(log_a, (0, 0, 1, 0))  # (B, 1 + T, C), log a_0 = 0
        log_b = torch.cat([h0.log()[:, None], log_b], dim=1)  # (B, 1 + T, C)
    a_star = log_a.cumsum(dim=1)
    h = torch.exp(a_star + torch.logcumsumexp(log_b - a_star, dim=1))
    return h if h0 is None else h[:, 1:]


class MinGRU(nn.Module):
    """One minGRU layer (Feng et al. 2024, "Were RNNs All We Needed?"): z_t = sigmoid(W_z x_t), h~_t = g(W_h x_t),
    h_t = (1 - z_t) h_{t-1} + z_t h~_t. Its gates read x_t alone, so the recurrence is linear in h and a scan
    computes it in parallel. Around it a pre-norm residual, as the paper's language model has: the residual keeps a
    direct path from the embedding to the head through any depth, and the norm gives W_z and W_h unit-scale inputs."""

    def __init__(self, config):
        super().__init__()
        self.ln = RMSNorm(config.n_embd)
        self.c_z = nn.Linear(config.n_embd, config.n_embd)  # the update gate's logits
        self.c_h = nn.Linear(config.n_embd, config.n_embd)  # the candidate state, before g
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, h0, mask, parallel):
        """x (B, T, C); h0 (B, C), or None for zeros; mask (B, T) False at left padding, or None; parallel: the scan
        or T sequential steps. Returns x plus the layer's h (B, T, C), and the last h (B, C) in fp32."""
        u = self.ln(x)
        # (B, T, C) in fp32 at least: the scan sums logs over the whole sequence
        k = self.c_z(u).to(torch.promote_types(u.dtype, torch.float32))
        pre = self.c_h(u).to(k.dtype)  # (B, T, C)
        h = self._scan(k, pre, h0, mask) if parallel else self._steps(k, pre, h0, mask)
        return x + self.drop(h).type_as(x), h[:, -1]

    def _scan(self, k, pre, h0, mask):
        log_z = -F.softplus(-k)  # log sigmoid(k)
        log_keep = -F.softplus(k)  # log (1 - sigmoid(k))
        if mask is not None:  # z = 0 at padding: h stays h0 there, and padding never enters the state
            pad = ~mask[..., None]  # (B, T, 1)
            log_z = log_z.masked_fill(pad, torch.finfo(log_z.dtype).min)  # finite: -inf would give nan gradients
            log_keep = log_keep.masked_fill(pad, 0.0)
        return parallel_scan_log(log_keep, log_z + log_g(pre), h0)

    def _steps(self, k, pre, h0, mask):
        z = torch.sigmoid(k)  # (B, T, C)
        if mask is not None:
            z = z.masked_fill(~mask[..., None], 0.0)
        h_tilde = g(pre)  # (B, T, C)
        h = h0 if h0 is not None else k.new_zeros(k.size(0), k.size(2))  # (B, C)
        hs = []
        # unbind slices once: an index z[:, t] per step would give each step's backward a full (B, T, C) gradient
        for z_t, h_tilde_t in zip(z.unbind(1), h_tilde.unbind(1)):
            h = (1 - z_t) * h + z_t * h_tilde_t
            hs.append(h)
        return torch.stack(hs, dim=1)


def left_padding_lengths(mask):
    """Each row's real tokens (B,), once mask (B, T) is checked to be left padding with a real token in every row."""
    T = mask.size(1)
    lengths = mask.sum(1)  # (B,)
    if (lengths == 0).any():
        raise ValueError("attention_mask has a row without real tokens; every sequence needs at least one")
    positions = torch.arange(T, device=mask.device)
    if not torch.equal(mask, positions[None] >= T - lengths[:, None]):
        raise ValueError("attention_mask must be left padding (False only before a row's first real token)")
    return lengths


class RNN(nn.Module):
    # minGRU only: read a sequence with the parallel scan (True) or with T sequential steps of the same layers (False);
    # one token is always a step
    scan = True

    def __init__(self, config: RNNConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        if config.type == "mingru":
            self.rnn = nn.ModuleList(MinGRU(config) for _ in range(config.n_layer))
            self.ln_f = RMSNorm(config.n_embd)  # the residual stream is unnormalised; the head reads it normalised
        else:
            recurrent = nn.LSTM if config.type == "lstm" else nn.GRU
            # dropout between stacked layers (Zaremba et al. 2014); PyTorch warns if it is set for a single layer
            self.rnn = recurrent(config.n_embd, config.n_embd, config.n_layer, batch_first=True,
                                 dropout=config.dropout if config.n_layer > 1 else 0.0)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # the cells read the embedding unnormalised, so it keeps PyTorch's unit scale N(0, 1): GPT's 0.02 stalls an
        # LSTM at chance on recall (docs/log.md). A tied matrix also makes the logits: U(±0.1) as in AWD-LSTM
        # (Merity et al. 2018)
        nn.init.normal_(self.lm_head.weight, mean=0.0, std=0.02)
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight
            nn.init.uniform_(self.wte.weight, -0.1, 0.1)
        if config.type == "lstm":  # recurrent matrices keep PyTorch's U(±1/√n_embd)
            for name, p in self.rnn.named_parameters():
                if name.startswith("bias"):
                    nn.init.zeros_(p)
                if name.startswith("bias_ih"):  # gates are (input, forget, cell, output)
                    # forget-gate bias 1 keeps the state from the first step (Jozefowicz et al. 2015)
                    nn.init.ones_(p[config.n_embd:2 * config.n_embd])

    def num_params(self, embeddings=True):
        """Parameters counted once (a tied head counts once); without embeddings drops wte."""
        n = sum(p.numel() for p in self.parameters())
        return n if embeddings else n - self.wte.weight.numel()

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward): 6N over the matmuls' weights, the head included and the
        embedding lookup not (nor minGRU's scan, elementwise: O(n_embd) per layer and token); unlike attention's, the
        recurrence's cost does not grow with seq_len."""
        head = self.lm_head.weight.numel() if self.config.tie_weights else 0  # an untied head is already counted
        return 6 * (self.num_params(embeddings=False) + head)

    context_window = None  # no limit: the state carries any length of context

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, **kwargs):
        """idx (B, T) followed by max_new_tokens sampled tokens (attnlab.decode.generate: top_p, stop_tokens,
        generator, attention_mask and kv_cache too), as nanoGPT's GPT.generate is called."""
        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, **kwargs)

    def new_cache(self, batch_size, device, dtype):
        return RNNState()

    def forward(self, idx, targets=None, attention_mask=None, cache=None, last_logits_only=False):
        """idx (B, T) token ids; attention_mask (B, T) True at real tokens (left padding); cache an RNNState to
        continue from and update. Returns logits (B, T, vocab) and the mean loss over real target positions."""
        x = self.drop(self.wte(idx))  # (B, T, C)
        state = cache.value if cache is not None else None
        if self.config.type == "mingru":
            y, state = self._mingru(x, attention_mask, state)
        elif attention_mask is None and idx.size(1) == 1 and not self.training:
            y, state = self._step(x[:, 0], state)
        elif attention_mask is None:
            y, state = self._recur(x, state)  # (B, T, C)
        else:
            y, state = self._left_padded(x, attention_mask.bool(), state)
        if cache is not None:
            cache.value, cache.length = state, cache.length + idx.size(1)
        if last_logits_only:
            y = y[:, -1:]
        logits = self.lm_head(self.drop(y))
        return logits, None if targets is None else lm_loss(logits, targets, attention_mask)

    def _mingru(self, x, mask, state):
        """x (B, T, C) through every minGRU layer, from state (n_layer, B, C) or None (zeros); returns the normalised
        outputs (B, T, C) and the new state."""
        if mask is not None:
            mask = mask.bool()
            left_padding_lengths(mask)  # raises unless mask is left padding
        parallel = self.scan and x.size(1) > 1
        last = []
        for layer, block in enumerate(self.rnn):
            x, h = block(x, None if state is None else state[layer], mask, parallel)
            last.append(h)
        return self.ln_f(x), torch.stack(last)

    def _recur(self, x, state):
        """self.rnn over a whole sequence (or a packed batch). A CPU without native bf16 has no oneDNN bf16 LSTM (it
        fails to build one), so under bf16 autocast there the recurrence runs in fp32, as a GRU does anyway."""
        if torch.is_autocast_enabled("cpu") and x.data.device.type == "cpu" and not native_bf16(x.data.device):
            with torch.autocast("cpu", enabled=False):
                return self.rnn(x, state)
        return self.rnn(x, state)

    def _step(self, x, state):
        """One token x (B, C) through every layer with the single-step cell kernels. On CPU the fused nn.LSTM repacks
        its weights on every call, which dominates a one-token step of decoding (docs/log.md)."""
        lstm = self.config.type == "lstm"
        if state is None:
            zeros = x.new_zeros(self.config.n_layer, x.size(0), self.config.n_embd)  # (L, B, C)
            state = (zeros, zeros) if lstm else zeros
        hs, cs = [], []
        for layer, weights in enumerate(self.rnn.all_weights):  # [W_ih, W_hh, b_ih, b_hh] per layer
            if lstm:
                x, c = torch.lstm_cell(x, (state[0][layer], state[1][layer]), *weights)
                cs.append(c)
            else:
                x = torch.gru_cell(x, state[layer], *weights)
            hs.append(x)
        return x[:, None], ((torch.stack(hs), torch.stack(cs)) if lstm else torch.stack(hs))

    def _left_padded(self, x, mask, state):
        """Run each sequence over its real tokens only, so padding never enters the state: shift the rows to
        right padding, pack them, run, and shift the outputs back. Padded positions get zero outputs."""
        B, T, C = x.shape
        lengths = left_padding_lengths(mask)
        positions = torch.arange(T, device=x.device)
        shift = (T - lengths)[:, None]  # (B, 1) padding per row
        to_left = ((positions[None] + shift) % T)[..., None].expand(B, T, C)  # (B, T, C) gather indices
        packed = pack_padded_sequence(x.gather(1, to_left), lengths.cpu(), batch_first=True, enforce_sorted=False)
        y, state = self._recur(packed, state)
        y = pad_packed_sequence(y, batch_first=True, total_length=T)[0]  # (B, T, C), real tokens first
        to_right = ((positions[None] - shift) % T)[..., None].expand(B, T, C)
        return y.gather(1, to_right), state
