"""Recurrent language models (LSTM, GRU) with GPT's interface: the baseline that attention replaced.

Pure PyTorch: token embedding -> n_layer LSTM or GRU layers of width n_embd -> linear head. train.py trains it
(model=lstm, model=gru) and attnlab/decode.py generates from it like a GPT (model.py's docstring lists the interface).
Where GPT keeps a KV cache that grows with the context, an RNN carries a fixed-size state: O(1) memory and time per
generated token, but T sequential steps to read T tokens (scripts/report measures both sides).
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab.runtime import native_bf16
from model import lm_loss, require


@dataclass
class RNNConfig:
    """The fields an RNN reads; config.ModelConfig holds their defaults and configs/model/lstm.yaml a preset."""
    type: str  # lstm | gru
    vocab_size: int  # tokens in the vocabulary (set from the prepared corpus)
    block_size: int  # training window in tokens (truncated backpropagation through time)
    n_layer: int  # stacked recurrent layers
    n_embd: int  # embedding and state width
    dropout: float  # between layers and before the head
    tie_weights: bool  # share the token embedding with the output head

    def __post_init__(self):
        require(self.type in ("lstm", "gru"), f"type={self.type!r} is not a recurrent model; use lstm or gru")
        for name in ("vocab_size", "block_size", "n_layer", "n_embd"):
            require(getattr(self, name) > 0, f"{name}={getattr(self, name)} must be positive")
        require(0.0 <= self.dropout < 1.0, f"dropout={self.dropout} must be in [0, 1)")


class RNNState:
    """Every layer's recurrent state: (h, c) for an LSTM, h for a GRU, each (n_layer, B, n_embd). Unlike a KVCache
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


class RNN(nn.Module):
    def __init__(self, config: RNNConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
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
        embedding lookup not; unlike attention's, the recurrence's cost does not grow with seq_len."""
        head = self.lm_head.weight.numel() if self.config.tie_weights else 0  # an untied head is already counted
        return 6 * (self.num_params(embeddings=False) + head)

    context_window = None  # no limit: the state carries any length of context

    def new_cache(self, batch_size, device, dtype):
        return RNNState()

    def forward(self, idx, targets=None, attention_mask=None, cache=None, last_logits_only=False):
        """idx (B, T) token ids; attention_mask (B, T) True at real tokens (left padding); cache an RNNState to
        continue from and update. Returns logits (B, T, vocab) and the mean loss over real target positions."""
        x = self.drop(self.wte(idx))  # (B, T, C)
        state = cache.value if cache is not None else None
        if attention_mask is None and idx.size(1) == 1 and not self.training:
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
        lengths = mask.sum(1)  # (B,)
        if (lengths == 0).any():
            raise ValueError("attention_mask has a row without real tokens; every sequence needs at least one")
        positions = torch.arange(T, device=x.device)
        if not torch.equal(mask, positions[None] >= T - lengths[:, None]):
            raise ValueError("attention_mask must be left padding (False only before a row's first real token)")
        shift = (T - lengths)[:, None]  # (B, 1) padding per row
        to_left = ((positions[None] + shift) % T)[..., None].expand(B, T, C)  # (B, T, C) gather indices
        packed = pack_padded_sequence(x.gather(1, to_left), lengths.cpu(), batch_first=True, enforce_sorted=False)
        y, state = self._recur(packed, state)
        y = pad_packed_sequence(y, batch_first=True, total_length=T)[0]  # (B, T, C), real tokens first
        to_right = ((positions[None] - shift) % T)[..., None].expand(B, T, C)
        return y.gather(1, to_right), state
