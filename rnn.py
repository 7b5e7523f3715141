"""Recurrent language models (LSTM, GRU) with GPT's interface: the baseline that attention replaced.

Pure PyTorch: token embedding -> n_layer LSTM or GRU layers of width n_embd -> linear head. train.py trains it
(model=lstm, model=gru) and sample.py samples from it like a GPT. Where GPT keeps a KV cache that grows with the
context, an RNN carries a fixed-size state: O(1) memory and time per generated token, but T sequential steps to
read T tokens (compare.py measures both sides).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from model import GPT, check_sampling, sample_token


class RNNState:
    """Every layer's recurrent state: (h, c) for an LSTM, h for a GRU, each (n_layer, B, n_embd). Unlike a KVCache
    its size does not depend on how many tokens it has read."""

    def __init__(self):
        self.value = None  # None until the first token: PyTorch then starts from zeros
        self.length = 0  # tokens read so far

    @property
    def nbytes(self):
        tensors = self.value if isinstance(self.value, tuple) else [self.value] if self.value is not None else []
        return sum(t.nbytes for t in tensors)


class RNN(nn.Module):
    def __init__(self, config):
        super().__init__()
        if config.type not in ("lstm", "gru"):
            raise ValueError(f"RNN type={config.type!r} is unknown; use lstm or gru")
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        recurrent = nn.LSTM if config.type == "lstm" else nn.GRU
        # dropout between stacked layers (Zaremba et al. 2014); PyTorch warns if it is set for a single layer
        self.rnn = recurrent(config.n_embd, config.n_embd, config.n_layer, batch_first=True,
                             dropout=config.dropout if config.n_layer > 1 else 0.0)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # the cells read the embedding unnormalised, so it keeps PyTorch's unit scale N(0, 1): at GPT's 0.02 an LSTM
        # sat at chance on recall for hundreds of steps. A tied matrix also makes the logits: U(±0.1) as in
        # AWD-LSTM (Merity et al. 2018)
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

    def forward(self, idx, targets=None, attention_mask=None, cache=None, last_logits_only=False):
        """idx (B, T) token ids; attention_mask (B, T) True at real tokens (left padding); cache an RNNState to
        continue from and update. Returns logits (B, T, vocab) and the mean loss over real target positions."""
        x = self.drop(self.wte(idx))  # (B, T, C)
        state = cache.value if cache is not None else None
        if attention_mask is None and idx.size(1) == 1 and not self.training:
            y, state = self._step(x[:, 0], state)
        elif attention_mask is None:
            y, state = self.rnn(x, state)  # (B, T, C)
        else:
            y, state = self._left_padded(x, attention_mask.bool(), state)
        if cache is not None:
            cache.value, cache.length = state, cache.length + idx.size(1)
        if last_logits_only:
            y = y[:, -1:]
        logits = self.lm_head(self.drop(y))
        loss = None
        if targets is not None:
            if attention_mask is not None:
                targets = targets.masked_fill(~attention_mask.bool(), -1)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def _step(self, x, state):
        """One token x (B, C) through every layer with the single-step cell kernels. On CPU the fused nn.LSTM repacks
        its weights on every call: ~25x slower for the one-token steps of decoding (compare.py, generation)."""
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
        y, state = self.rnn(packed, state)
        y = pad_packed_sequence(y, batch_first=True, total_length=T)[0]  # (B, T, C), real tokens first
        to_right = ((positions[None] - shift) % T)[..., None].expand(B, T, C)
        return y.gather(1, to_right), state

    @torch.no_grad()
    def generate_stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, stop_tokens=None,
                        generator=None, attention_mask=None, kv_cache=True):
        """As GPT.generate_stream. With kv_cache the recurrent state is carried from token to token: O(1) time and
        memory per token and no context limit. Without it every step re-reads the whole sequence from a zero state
        (O(T) per token); that gives the same tokens, and is there to check it."""
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        B = idx.size(0)
        mask = None if attention_mask is None else attention_mask.bool()
        done = torch.zeros(B, dtype=torch.bool, device=idx.device)
        stops = torch.tensor(sorted(stop_tokens or []), dtype=torch.long, device=idx.device)
        cache = RNNState() if kv_cache else None
        for _ in range(max_new_tokens):
            whole = cache is None or cache.length == 0  # read the prompt (or everything, without a cache)
            logits, _ = self(idx if whole else idx[:, -1:], attention_mask=mask if whole else None, cache=cache,
                             last_logits_only=True)
            next_token = sample_token(logits[:, -1].float(), temperature, top_k, top_p, generator)  # (B,)
            if stops.numel():
                next_token = torch.where(done, idx[:, -1], next_token)
                done |= torch.isin(next_token, stops)
            idx = torch.cat([idx, next_token[:, None]], dim=1)
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
            yield next_token
            if stops.numel() and done.all():
                return

    generate = GPT.generate  # the same collector over generate_stream
