"""A compact causal transformer (GPT) with RoPE, grouped-query and sliding-window attention, padding masks, a KV cache.

Pure PyTorch modelling: no I/O, no config framework. Read it bottom-up: config, norms and positions, the cache,
attention, MLP, block, the model. The language-model interface it shares with attnlab/rnn.py: forward(idx, targets,
attention_mask, cache, last_logits_only) -> (logits, loss), new_cache, context_window, num_params,
flops_per_token. `train.py` trains it; attnlab/decode.py generates from it (`sample.py` on the command line).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 256  # tokens in the vocabulary (set from the prepared corpus)
    block_size: int = 128  # longest context the model sees, in tokens
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # query heads per attention layer
    n_kv_head: int | None = None  # key/value heads (grouped-query attention); None means n_head
    n_embd: int = 192  # residual stream width
    dropout: float = 0.0  # dropout on attention weights and residual branches; 0 for short runs
    bias: bool = False  # biases in linear layers and LayerNorm (GPT-2 has them)
    pos: str = "rope"  # position information: rope | learned | sinusoidal | none
    rope_base: float = 10000.0  # RoPE frequency base (Su et al. 2021)
    tie_weights: bool = True  # share the token embedding with the output head (Press & Wolf 2017)
    attn: str = "sdpa"  # sdpa (fused kernels) | manual (the plain formula, can return weights)
    norm: str = "rmsnorm"  # rmsnorm | layernorm (GPT-2's)
    mlp: str = "relu2"  # relu2 (squared ReLU, Primer) | gelu (tanh approximation, as GPT-2)
    qk_norm: bool = True  # RMS-normalise queries and keys per head before the dot product
    window: int = 0  # each query attends to itself and the window-1 tokens before it; 0 = full causal attention

    def __post_init__(self):
        # checked in order, each message built only once the checks before it hold: n_embd // n_head needs n_head > 0
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            require(getattr(self, name) > 0, f"{name}={getattr(self, name)} must be positive")
        require(self.n_kv_head is None or self.n_kv_head > 0, f"n_kv_head={self.n_kv_head} must be positive or None")
        require(self.n_embd % self.n_head == 0,
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; pick n_embd a multiple of n_head")
        require(self.n_head % self.kv_heads == 0,
                f"n_head={self.n_head} is not a multiple of n_kv_head={self.kv_heads}; pick n_kv_head dividing n_head")
        require(self.pos in ("rope", "learned", "sinusoidal", "none"),
                f"pos={self.pos!r} is unknown; use rope, learned, sinusoidal or none")
        require(self.pos != "rope" or self.head_size % 2 == 0,
                f"RoPE needs an even head size, got n_embd/n_head={self.head_size}; change n_embd or n_head")
        require(self.pos != "sinusoidal" or self.n_embd % 2 == 0, "sinusoidal positions need an even n_embd")
        require(self.attn in ("sdpa", "manual"), f"attn={self.attn!r} is unknown; use sdpa or manual")
        require(self.norm in ("layernorm", "rmsnorm"), f"norm={self.norm!r} is unknown; use layernorm or rmsnorm")
        require(self.mlp in ("gelu", "relu2"), f"mlp={self.mlp!r} is unknown; use gelu or relu2")
        require(0.0 <= self.dropout < 1.0, f"dropout={self.dropout} must be in [0, 1)")
        require(self.rope_base > 0, f"rope_base={self.rope_base} must be positive")
        require(self.window >= 0, f"window={self.window} must be >= 0; use 0 for full causal attention")

    @property
    def kv_heads(self):
        return self.n_kv_head or self.n_head

    @property
    def head_size(self):
        return self.n_embd // self.n_head


def require(ok, message):
    """A config check: ValueError(message) unless ok. The message names the fix."""
    if not ok:
        raise ValueError(message)


def lm_loss(logits, targets, attention_mask=None):
    """Mean cross-entropy over real target positions (-1 and padded positions are ignored), computed in fp32."""
    if attention_mask is not None:
        targets = targets.masked_fill(~attention_mask.bool(), -1)
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


def make_norm(config, dim):
    return nn.RMSNorm(dim) if config.norm == "rmsnorm" else nn.LayerNorm(dim, bias=config.bias)


def sinusoidal_table(length, dim):
    """The fixed position table of "Attention Is All You Need", (length, dim)."""
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    angles = torch.arange(length, dtype=torch.float32)[:, None] * freq  # (length, dim/2)
    return torch.stack([angles.sin(), angles.cos()], -1).flatten(1)  # sin in the even columns, cos in the odd


def rope_tables(length, head_size, base):
    """cos and sin of position * frequency, each (length, head_size): the halves repeat, sin's first one negated."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)  # (length, head_size/2)
    return torch.cat([angles.cos(), angles.cos()], 1), torch.cat([-angles.sin(), angles.sin()], 1)


def apply_rope(x, cos, sin):
    """Rotate each (x1, x2) pair of x (B, nh, T, hs) by its position's angle; cos/sin (B or 1, 1, T, hs).
    (x1, x2) -> (x1·cos - x2·sin, x2·cos + x1·sin), written with the halves swapped by one roll: three kernels
    instead of eight, which shows in the per-token cost of decoding."""
    return torch.addcmul(x * cos, x.roll(x.size(-1) // 2, -1), sin).type_as(x)


class KVCache:
    """Keys and values of every layer for batch_size sequences, in max_len slots: sequence index p in slot
    p % max_len. A windowed model's cache has only `window` slots, a ring of the keys its queries can still see, so
    its memory stays constant however many tokens are generated. Keys are stored after RoPE: slot order is free."""

    def __init__(self, config, batch_size, max_len, device, dtype):
        self.slots = min(max_len, config.window or max_len)
        shape = (config.n_layer, batch_size, config.kv_heads, self.slots, config.head_size)
        self.k = torch.empty(shape, device=device, dtype=dtype)  # only filled slots are ever read
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.layers = [(self.k[i], self.v[i]) for i in range(config.n_layer)]  # views made once: fewer ops per token
        self.key_mask = torch.empty(batch_size, self.slots, dtype=torch.bool, device=device)  # False at padding
        self.pads = torch.empty(batch_size, 1, dtype=torch.long, device=device)  # padding tokens so far
        self.nbytes = self.k.nbytes + self.v.nbytes  # constant: every slot is allocated here
        self.clear()

    def clear(self):
        """Forget every token, keeping the memory (generation refills the cache when its context is full)."""
        self.key_mask.fill_(True)
        self.pads.zero_()
        self.masked = False  # whether each forward needs a mask: after padding, or several tokens continuing the cache
        self.length = 0  # tokens taken so far: sequence indices 0 .. length - 1

    def append(self, query_pos, real=None):
        """Place new tokens at sequence indices query_pos (T,), real (B, T) False at padding, before the layers store
        them. Returns the keys update will return, as sequence indices (S,) and real (B, S), or None, None where no
        mask is needed; and the padding before each new token (B, T), or 0."""
        start, (T,), size = self.length, query_pos.shape, self.slots
        # one token is written first, then read with the filled slots (each holds the latest index congruent to it);
        # more read the earlier slots and their own keys, then write, since writing first could overwrite keys they see
        filled, self.length = start + (T == 1), start + T
        self.read, self.write = min(filled, size), query_pos[-size:] % size
        if real is None and not self.masked and (T == 1 or start == 0):
            return None, None, 0  # one query sees every key read, several see their own keys only, causally
        key_pos = filled - 1 - (filled - 1 - torch.arange(self.read, device=query_pos.device)) % size  # (read,)
        key_pos = key_pos if T == 1 else torch.cat([key_pos, query_pos])
        real = query_pos.new_ones(self.pads.size(0), T, dtype=torch.bool) if real is None else real
        key_real = torch.cat([self.key_mask[:, :self.read], real], 1) if T > 1 else None  # read before the write
        self.key_mask[:, self.write] = real[:, -size:]
        pads = self.pads + (~real).cumsum(1)
        self.masked, self.pads = True, pads[:, -1:]
        return key_pos, key_real if T > 1 else self.key_mask[:, :self.read], pads

    def update(self, layer, k, v):
        """Store k, v (B, n_kv_head, T, hs) where append placed them; return the keys and values the T queries see."""
        keys, values = self.layers[layer]
        if k.size(2) > 1:
            seen = torch.cat([keys.narrow(2, 0, self.read), k], 2), torch.cat([values.narrow(2, 0, self.read), v], 2)
        for stored, new in ((keys, k), (values, v)):
            stored.index_copy_(2, self.write, new[:, :, -self.slots:])
        return seen if k.size(2) > 1 else (keys.narrow(2, 0, self.read), values.narrow(2, 0, self.read))


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.layer, self.n_head, self.n_kv_head, self.window = layer, config.n_head, config.kv_heads, config.window
        self.head_size, self.dropout, self.backend = config.head_size, config.dropout, config.attn
        # Q = XW_Q, K = XW_K, V = XW_V as one fused matmul; K and V have n_kv_head heads each
        self.c_attn = nn.Linear(config.n_embd, (config.n_head + 2 * config.kv_heads) * config.head_size, config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.q_norm = nn.RMSNorm(config.head_size) if config.qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(config.head_size) if config.qk_norm else nn.Identity()

    def forward(self, x, rope=None, mask=None, cache=None, return_weights=False):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split([self.n_head * self.head_size, self.n_kv_head * self.head_size,
                                        self.n_kv_head * self.head_size], dim=2)
        q = self.q_norm(q.view(B, T, self.n_head, self.head_size).transpose(1, 2))  # (B, nh, T, hs)
        k = self.k_norm(k.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2))  # (B, nkv, T, hs)
        v = v.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2)  # (B, nkv, T, hs)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B, nkv, S, hs), S = cached + T
        # mask None with T > 1: causal (band-causal with a window) over these T keys; T == 1 sees every key
        is_causal = mask is None and T > 1
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if self.backend == "manual" or return_weights:
            y, weights = manual_attention(q, k, v, mask, is_causal, dropout_p, self.window)
        elif is_causal and T > self.window > 0:  # a band narrower than T: O(T·W) by chunks (padding: a full mask)
            y = banded_attention(q, k, v, self.window, dropout_p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                               enable_gqa=self.n_kv_head != self.n_head)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side: (B, T, nh * hs)
        return self.resid_dropout(self.c_proj(y)), weights


def band_mask(query_pos, key_pos, window=0):
    """(T, S), True where a query at sequence index query_pos (T,) may see the key at key_pos (S,): causal, and with
    a window only the last `window` tokens, itself included (i - window < j <= i)."""
    back = query_pos[:, None] - key_pos  # how many tokens back each key is
    return (back >= 0) & (back < window) if window else back >= 0


def manual_attention(q, k, v, mask, is_causal, dropout_p=0.0, window=0):
    """softmax(QKᵀ/√d_k)V written out; returns the output (B, nh, T, hs) and the weights (B, nh, T, S)."""
    groups = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # GQA: share each K/V head
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, nh, T, S)
    if is_causal:
        S = k.size(2)
        mask = band_mask(torch.arange(S - q.size(2), S, device=q.device), torch.arange(S, device=q.device), window)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return F.dropout(weights, dropout_p) @ v, weights


def banded_attention(q, k, v, window, dropout_p=0.0):
    """Band-causal attention in O(T·W) time and memory (Beltagy et al. 2020, Longformer): each chunk of W queries
    against the previous chunk's keys and its own, 2W keys under one (W, 2W) band, all chunks in one SDPA call.
    q (B, nh, T, hs), k and v (B, nkv, T, hs); returns (B, nh, T, hs)."""
    (B, nh, T, hs), W = q.shape, window
    n = -(-T // W)  # chunks; zeros pad the last one (keys after every real query, which none of them sees)
    q = F.pad(q, (0, 0, 0, n * W - T)).unflatten(2, (n, W)).transpose(1, 2).flatten(0, 1)  # (B·n, nh, W, hs)
    # each chunk's keys and values: the previous chunk's (zeros before the first) and its own, (B·n, nkv, 2W, hs)
    k, v = (F.pad(x, (0, 0, W, n * W - T)).unfold(2, 2 * W, W).permute(0, 2, 1, 4, 3).flatten(0, 1) for x in (k, v))
    key, chunk = torch.arange(2 * W, device=q.device), torch.arange(n, device=q.device)[:, None, None, None]
    # query i sits at key W + i; the first chunk must not see the zeros before it
    mask = (band_mask(key[W:], key, W) & ((chunk > 0) | (key >= W))).repeat(B, 1, 1, 1)  # (B·n, 1, W, 2W)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=nh != k.size(1))
    return y.unflatten(0, (B, n)).transpose(1, 2).flatten(2, 3)[:, :, :T]  # (B, nh, T, hs)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.relu2 = config.mlp == "relu2"

    def forward(self, x):
        h = self.c_fc(x)
        h = F.relu(h).square() if self.relu2 else F.gelu(h, approximate="tanh")
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = make_norm(config, config.n_embd)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = make_norm(config, config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, rope=None, mask=None, cache=None, return_weights=False):
        a, weights = self.attn(self.ln_1(x), rope, mask, cache, return_weights)
        x = x + a
        return x + self.mlp(self.ln_2(x)), weights


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=make_norm(config, config.n_embd),
        ))
        if config.pos == "learned":
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
        if config.pos == "sinusoidal":
            self.register_buffer("sinusoid", sinusoidal_table(config.block_size, config.n_embd), persistent=False)
        if config.pos == "rope":
            cos, sin = rope_tables(config.block_size, config.head_size, config.rope_base)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: scale residual projections by 1/√(2·n_layer)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, embeddings=True):
        """Parameters counted once (a tied head counts once); without embeddings drops wte and wpe."""
        skip = () if embeddings else ("transformer.wte", "transformer.wpe")
        return sum(p.numel() for name, p in self.named_parameters() if not name.startswith(skip))

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward): 6N for the matmuls plus 12·L·C·T for attention
        (PaLM, appendix B). N counts the output head but not the embedding lookups."""
        cfg, T = self.config, seq_len or self.config.block_size
        n = self.num_params(embeddings=False) + self.lm_head.weight.numel() * cfg.tie_weights  # tied: skipped as wte
        return 6 * n + 12 * cfg.n_layer * cfg.n_embd * min(T, cfg.window or T)  # a query sees at most window keys

    @property
    def context_window(self):
        """The most tokens one forward pass reads: decoding slides its window within this."""
        return self.config.block_size

    def new_cache(self, batch_size, device, dtype):
        """An empty KV cache for batch_size sequences of up to context_window tokens."""
        return KVCache(self.config, batch_size, self.config.block_size, device, dtype)

    def forward(self, idx, targets=None, attention_mask=None, cache=None, last_logits_only=False,
                return_weights=False):
        """idx (B, T) token ids; attention_mask (B, T) True at real tokens (left padding); cache a KVCache
        continued from its filled positions. Returns logits (B, T, vocab), and the mean loss over real
        target positions (None without targets); with return_weights also each layer's (B, nh, T, S)."""
        T, start = idx.size(1), cache.length if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than block_size={self.config.block_size}")
        query_pos = torch.arange(start, start + T, device=idx.device)  # (T,) each token's index in the sequence
        real = None if attention_mask is None else attention_mask.bool()  # (B, T)
        # the keys attention sees, (S,) and real (B, S) (None: plain causal needs no mask); padding before each token
        key_pos, key_real, pads = (cache.append(query_pos, real) if cache is not None else
                                   (None, None, 0) if real is None else (query_pos, real, (~real).cumsum(1)))
        mask, positions = None, (query_pos[None] - pads).clamp(min=0)  # (B|1, T): real tokens before each one
        if key_pos is not None:  # padding, or several queries continuing a cache
            # causal, in the window, real keys only; each query also sees itself so that no row is empty (padded rows)
            mask = band_mask(query_pos, key_pos, self.config.window) & key_real[:, None]  # (B, T, S)
            mask = (mask | (key_pos == query_pos[:, None]))[:, None]  # (B, 1, T, S), broadcast over heads
        x = self.transformer.wte(idx)  # (B, T, C)
        rope = None
        if self.config.pos == "learned":
            x = x + self.transformer.wpe(positions)
        elif self.config.pos == "sinusoidal":
            x = x + self.sinusoid[positions]
        elif self.config.pos == "rope":
            rope = (self.rope_cos[positions][:, None], self.rope_sin[positions][:, None])  # (B|1, 1, T, hs)
        x = self.transformer.drop(x)
        all_weights = []
        for block in self.transformer.h:
            x, weights = block(x, rope, mask, cache, return_weights)
            all_weights.append(weights)
        logits = self.lm_head(self.transformer.ln_f(x[:, -1:] if last_logits_only else x))
        loss = None if targets is None else lm_loss(logits, targets, attention_mask)
        return (logits, loss, all_weights) if return_weights else (logits, loss)

    @torch.no_grad()
    def attention_maps(self, idx, attention_mask=None):
        """Each layer's attention weights (B, n_head, T, T), computed by the plain reference path."""
        return self(idx, attention_mask=attention_mask, return_weights=True)[2]
