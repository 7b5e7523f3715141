"""A compact causal transformer (GPT) with RoPE, grouped-query and sliding-window attention, padding masks, a KV cache.

Pure PyTorch modelling: no I/O, no config framework. Read it bottom-up: config, norms and positions, attention's
masks and kernels, the cache, attention, MLP, block, the model. The language-model interface it shares with
attnlab/rnn.py: forward(idx, targets, attention_mask, cache, last_logits_only) -> (logits, loss), new_cache,
context_window, num_params, flops_per_token. `train.py` trains it; attnlab/decode.py generates from it (`sample.py`
on the command line).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlab.decode import generate
from attnlab.loss import chunked_lm_loss, chunks_pay, compute_dtype


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
    ngram: int = 0  # hashed n-gram embeddings: a row per n-gram ending at each token, orders 2 to ngram (0: none)
    ngram_buckets: int = 8192  # each order's rows; n-grams whose hashes collide share one
    window: int = 0  # each query attends to itself and the window-1 tokens before it; 0 = full causal attention

    def __post_init__(self):
        # in this order: the later checks divide by n_head and n_kv_head, which the first ones make positive
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            require(value > 0, f"{name}={value} must be positive")
        if self.n_kv_head is not None:
            require(self.n_kv_head > 0, f"n_kv_head={self.n_kv_head} must be positive or None")
        require(self.n_embd % self.n_head == 0,
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; pick n_embd a multiple of n_head")
        require(self.n_head % self.kv_heads == 0,
                f"n_head={self.n_head} is not a multiple of n_kv_head={self.kv_heads}; pick n_kv_head dividing n_head")
        require(self.pos in ("rope", "learned", "sinusoidal", "none"),
                f"pos={self.pos!r} is unknown; use rope, learned, sinusoidal or none")
        if self.pos == "rope":
            require(self.head_size % 2 == 0,
                    f"RoPE needs an even head size, got n_embd/n_head={self.head_size}; change n_embd or n_head")
        if self.pos == "sinusoidal":
            require(self.n_embd % 2 == 0, "sinusoidal positions need an even n_embd")
        require(self.attn in ("sdpa", "manual"), f"attn={self.attn!r} is unknown; use sdpa or manual")
        require(self.norm in ("layernorm", "rmsnorm"), f"norm={self.norm!r} is unknown; use layernorm or rmsnorm")
        require(self.mlp in ("gelu", "relu2"), f"mlp={self.mlp!r} is unknown; use gelu or relu2")
        require(0.0 <= self.dropout < 1.0, f"dropout={self.dropout} must be in [0, 1)")
        require(self.rope_base > 0, f"rope_base={self.rope_base} must be positive")
        require(self.window >= 0, f"window={self.window} must be >= 0; use 0 for full causal attention")
        require(self.ngram == 0 or self.ngram >= 2,
                f"ngram={self.ngram} must be 0 (none) or an n-gram order of 2 or more, e.g. 4")
        require(self.ngram_buckets > 0, f"ngram_buckets={self.ngram_buckets} must be positive, e.g. 8192")

    @property
    def kv_heads(self):
        if self.n_kv_head is None:
            return self.n_head
        return self.n_kv_head

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
    logits = logits.float().view(-1, logits.size(-1))  # (B·T, vocab)
    return F.cross_entropy(logits, targets.reshape(-1), ignore_index=-1)


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm computed in fp32 and returned in its input's dtype: under bf16 autocast the input is bf16 and the
    gain fp32 (under FSDP2's bf16 gathers the other way round), a mix torch's fused kernel refuses (with a warning,
    falling back to an unfused path). fp64 stays fp64."""

    def forward(self, x):
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))  # (B, T, C) in fp32 at least
        return F.rms_norm(x32, self.normalized_shape, self.weight.to(x32.dtype), self.eps).type_as(x)


def make_norm(config, dim):
    if config.norm == "rmsnorm":
        return RMSNorm(dim)
    return nn.LayerNorm(dim, bias=config.bias)


def sinusoidal_table(length, dim):
    """The fixed position table of "Attention Is All You Need", (length, dim)."""
    even = torch.arange(0, dim, 2, dtype=torch.float32)  # (dim/2,) the even column indices 2i
    freq = torch.exp(even * (-math.log(10000.0) / dim))  # (dim/2,) 10000^(-2i/dim)
    angles = torch.arange(length, dtype=torch.float32)[:, None] * freq  # (length, dim/2)
    table = torch.stack([angles.sin(), angles.cos()], -1)  # (length, dim/2, 2)
    return table.flatten(1)  # (length, dim): sin in the even columns, cos in the odd


def rope_tables(length, head_size, base):
    """cos and sin of position * frequency, each (length, head_size): the halves repeat, sin's first one negated."""
    exponents = torch.arange(0, head_size, 2, dtype=torch.float32) / head_size  # (hs/2,) 2i/hs
    inv_freq = 1.0 / base ** exponents  # (hs/2,)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)  # (length, hs/2)
    cos = torch.cat([angles.cos(), angles.cos()], 1)  # (length, hs)
    sin = torch.cat([-angles.sin(), angles.sin()], 1)  # (length, hs)
    return cos, sin


def apply_rope(x, cos, sin):
    """Rotate each (x1, x2) pair of x (B, nh, T, hs) by its position's angle; cos/sin (B or 1, 1, T, hs).
    (x1, x2) -> (x1·cos - x2·sin, x2·cos + x1·sin), written with the halves swapped by one roll: three kernels
    instead of eight, which shows in the per-token cost of decoding."""
    x_cos = x * cos  # (B, nh, T, hs)
    swapped = x.roll(x.size(-1) // 2, -1)  # (B, nh, T, hs): (x2, x1)
    return torch.addcmul(x_cos, swapped, sin).type_as(x)  # x·cos + swapped·sin, sin's first half negated


def ngram_rows(tokens, n, buckets):
    """(B, T, n-1): for tokens (B, n-1+T), whose first n-1 are context only, the table row of each token's n-grams
    of orders 2 to n: a polynomial hash modulo the prime 2^31 - 1 (below 2^63 for any id under 2^31), then order k's
    share of buckets rows, which start at (k - 2) * buckets."""
    T = tokens.size(1) - (n - 1)
    h = tokens[:, n - 1:]  # (B, T): the hash of the 1-gram, each token itself
    rows = []
    for order in range(2, n + 1):
        h = (h * 1_000_003 + tokens[:, n - order:n - order + T]) % (2**31 - 1)  # the n-gram one token longer
        rows.append(h % buckets + (order - 2) * buckets)
    return torch.stack(rows, -1)


def band_mask(query_pos, key_pos, window=0):
    """(T, S), True where a query at sequence index query_pos (T,) may see the key at key_pos (S,): causal, and with
    a window only the last `window` tokens, itself included (i - window < j <= i)."""
    back = query_pos[:, None] - key_pos  # (T, S): how many tokens back each key is
    if window:
        return (back >= 0) & (back < window)
    return back >= 0


def manual_attention(q, k, v, mask, is_causal, dropout_p=0.0, window=0):
    """softmax(QKᵀ/√d_k)V written out; returns the output (B, nh, T, hs) and the weights (B, nh, T, S)."""
    groups = q.size(1) // k.size(1)  # query heads per K/V head (GQA)
    k = k.repeat_interleave(groups, dim=1)  # (B, nh, S, hs)
    v = v.repeat_interleave(groups, dim=1)  # (B, nh, S, hs)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, nh, T, S)
    if is_causal:
        S = k.size(2)
        T = q.size(2)
        query_pos = torch.arange(S - T, S, device=q.device)  # the queries are the last T keys
        key_pos = torch.arange(S, device=q.device)
        mask = band_mask(query_pos, key_pos, window)  # (T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)  # (B, nh, T, S)
    y = F.dropout(weights, dropout_p) @ v  # (B, nh, T, hs)
    return y, weights


def chunk_with_previous(x, W, pad):
    """Each chunk of W keys (or values) of x (B, nkv, T, hs) beside the chunk before it, zeros before the first and
    `pad` zeros after the last: (B·n, nkv, 2W, hs) for n chunks."""
    x = F.pad(x, (0, 0, W, pad))  # (B, nkv, W + n·W, hs)
    x = x.unfold(2, 2 * W, W)  # (B, nkv, n, hs, 2W): chunk c's keys and the W before them
    x = x.permute(0, 2, 1, 4, 3)  # (B, n, nkv, 2W, hs)
    return x.flatten(0, 1)  # (B·n, nkv, 2W, hs)


def banded_attention(q, k, v, window, dropout_p=0.0):
    """Band-causal attention in O(T·W) time and memory (Beltagy et al. 2020, Longformer): each chunk of W queries
    against the previous chunk's keys and its own, 2W keys under one (W, 2W) band, all chunks in one SDPA call.
    q (B, nh, T, hs), k and v (B, nkv, T, hs); returns (B, nh, T, hs)."""
    B, nh, T, hs = q.shape
    W = window
    n = (T + W - 1) // W  # chunks
    pad = n * W - T  # zeros fill the last chunk: keys after every real query, which none of them sees
    q = F.pad(q, (0, 0, 0, pad))  # (B, nh, n·W, hs)
    q = q.unflatten(2, (n, W))  # (B, nh, n, W, hs)
    q = q.transpose(1, 2)  # (B, n, nh, W, hs)
    q = q.flatten(0, 1)  # (B·n, nh, W, hs)
    k = chunk_with_previous(k, W, pad)  # (B·n, nkv, 2W, hs)
    v = chunk_with_previous(v, W, pad)  # (B·n, nkv, 2W, hs)
    key = torch.arange(2 * W, device=q.device)  # a chunk's keys: the previous chunk's W, then its own W
    chunk = torch.arange(n, device=q.device)[:, None, None, None]  # (n, 1, 1, 1)
    # query i sits at key W + i; the first chunk must not see the zeros before it
    in_band = band_mask(key[W:], key, W)  # (W, 2W)
    after_start = (chunk > 0) | (key >= W)  # (n, 1, 1, 2W)
    mask = (in_band & after_start).repeat(B, 1, 1, 1)  # (B·n, 1, W, 2W)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=nh != k.size(1))
    y = y.unflatten(0, (B, n))  # (B, n, nh, W, hs)
    y = y.transpose(1, 2)  # (B, nh, n, W, hs)
    y = y.flatten(2, 3)  # (B, nh, n·W, hs)
    return y[:, :, :T]  # (B, nh, T, hs): the padding queries dropped


@dataclass
class AttentionKeys:
    """The keys one forward pass attends to, where it needs a mask (padding, or several tokens continuing a cache)."""
    pos: torch.Tensor  # (S,) each key's sequence index
    real: torch.Tensor  # (B, S) False at padding
    pads: torch.Tensor  # (B, T) padding tokens in each row up to and including each query

    def mask(self, query_pos, window=0):
        """(B, 1, T, S) for queries at query_pos (T,): causal, in the window, real keys only; each query also sees
        itself so that no row is empty (a padding query's row)."""
        mask = band_mask(query_pos, self.pos, window) & self.real[:, None]  # (B, T, S)
        mask = mask | (self.pos == query_pos[:, None])  # (B, T, S)
        return mask[:, None]  # (B, 1, T, S): broadcast over heads

    def positions(self, query_pos):
        """(B, T): each query's index among the real tokens of its row (0 for padding)."""
        return (query_pos[None] - self.pads).clamp(min=0)


class KVCache:
    """Keys and values of every layer for batch_size sequences, in max_len slots: sequence index p in slot
    p % slots. A windowed model's cache has only `window` slots, a ring of the keys its queries can still see, so
    its memory stays constant however many tokens are generated. Keys are stored after RoPE: slot order is free.

    A forward pass of T new tokens, at sequence indices length .. length + T - 1, calls update_mask before the layers
    (keep their padding flags, get the keys they see for the mask and the positions), update in each layer (store
    its keys and values, get those its queries see) and advance after them (count the tokens as held). One token
    (decoding) is stored in its slot first and then read with the filled slots (token_keys, update_token); several
    are read after the filled slots and stored last, since storing them first could overwrite keys they see
    (tokens_keys, update_tokens)."""

    def __init__(self, config, batch_size, max_len, device, dtype):
        self.batch_size = batch_size
        self.slots = max_len
        if config.window:
            self.slots = min(max_len, config.window)
        shape = (config.n_layer, batch_size, config.kv_heads, self.slots, config.head_size)
        self.k = torch.empty(shape, device=device, dtype=dtype)  # only filled slots are ever read
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.layers = [(self.k[i], self.v[i]) for i in range(config.n_layer)]  # views made once: fewer ops per token
        self.nbytes = self.k.nbytes + self.v.nbytes  # constant: every slot is allocated here
        self.clear()

    def clear(self):
        """Forget every token, keeping the keys' and values' memory (generation refills the cache when its context is
        full)."""
        self.length = 0  # tokens held: sequence indices 0 .. length - 1
        self.tokens = None  # (B, ngram - 1): the last tokens held, for a model with n-gram embeddings
        # (B, slots) False at padding and (B, 1) padding tokens so far, kept from the first call that needs a mask:
        # from then on every call builds one from them
        self.key_mask = None
        self.pads = None

    def needs_mask(self, T, real=None):
        """Whether T new tokens, real (B, T) False at padding, need a mask: padding among them, several tokens
        continuing the cache, or padding flags kept since an earlier call. Plain causal attention serves a first call
        (its queries see each other only) and one token after unmasked ones (it sees every slot read)."""
        if real is not None or self.key_mask is not None:
            return True
        return T > 1 and self.length > 0

    def held_positions(self, held):
        """(min(held, slots),): the sequence index each filled slot holds while the cache holds `held` tokens, the
        latest one congruent to it."""
        newest = held - 1
        slot = torch.arange(min(held, self.slots), device=self.k.device)
        return newest - (newest - slot) % self.slots

    def update_mask(self, query_pos, real=None):
        """Before the layers: keep the padding flags of T new tokens at sequence indices query_pos (T,), real (B, T)
        False at padding (None: all real), and return the keys they see (AttentionKeys); None where plain causal
        attention serves."""
        T = query_pos.size(0)
        if not self.needs_mask(T, real):
            return None
        if real is None:
            real = query_pos.new_ones(self.batch_size, T, dtype=torch.bool)
        if self.key_mask is None:  # the first call that needs a mask: every token held so far is real
            self.key_mask = real.new_ones(self.batch_size, self.slots)
            self.pads = query_pos.new_zeros(self.batch_size, 1)
        pads = self.pads + (~real).cumsum(1)  # (B, T) padding in each row up to and including each token
        self.pads = pads[:, -1:]  # (B, 1)
        if T == 1:
            return self.token_keys(real, pads)
        return self.tokens_keys(query_pos, real, pads)

    def token_keys(self, real, pads):
        """The keys one new token sees: its flag stored in its slot, then every filled slot, its own among them."""
        self.key_mask[:, self.length % self.slots] = real[:, 0]
        key_pos = self.held_positions(self.length + 1)  # (read,)
        key_real = self.key_mask[:, :key_pos.size(0)].clone()  # (B, read)
        return AttentionKeys(pos=key_pos, real=key_real, pads=pads)

    def tokens_keys(self, query_pos, real, pads):
        """The keys several new tokens see: the filled slots, then their own; of more than `slots` tokens only the
        last `slots` flags are stored."""
        stored_pos = self.held_positions(self.length)  # (read,)
        key_pos = torch.cat([stored_pos, query_pos])  # (read + T,)
        key_real = torch.cat([self.key_mask[:, :stored_pos.size(0)], real], 1)  # (B, read + T)
        slot = query_pos[-self.slots:] % self.slots  # the last `slots` tokens' slots
        self.key_mask[:, slot] = real[:, -self.slots:]
        return AttentionKeys(pos=key_pos, real=key_real, pads=pads)

    def get_layer_cache(self, layer):
        """One layer's key and value slots, each (B, n_kv_head, slots, hs)."""
        return self.layers[layer]

    def update(self, layer, k, v):
        """In each layer: store its new keys and values k, v (B, n_kv_head, T, hs); return the keys and values its T
        queries see, each (B, n_kv_head, S, hs) in the order of update_mask's keys."""
        if k.size(2) == 1:
            return self.update_token(layer, k, v)
        return self.update_tokens(layer, k, v)

    def update_token(self, layer, k, v):
        """One token: one copy into its slot, then every filled slot read, its own among them."""
        keys, values = self.get_layer_cache(layer)
        slot = self.length % self.slots
        keys.narrow(2, slot, 1).copy_(k)
        values.narrow(2, slot, 1).copy_(v)
        read = min(self.length + 1, self.slots)
        return keys.narrow(2, 0, read), values.narrow(2, 0, read)

    def update_tokens(self, layer, k, v):
        """Several tokens: the filled slots, then their own keys and values, stored after they are read (index p in
        slot p % slots; of more than `slots` tokens only the last `slots` are kept)."""
        keys, values = self.get_layer_cache(layer)
        read = min(self.length, self.slots)
        seen_keys = torch.cat([keys.narrow(2, 0, read), k], 2)  # (B, nkv, read + T, hs)
        seen_values = torch.cat([values.narrow(2, 0, read), v], 2)  # (B, nkv, read + T, hs)
        kept = torch.arange(self.length, self.length + k.size(2), device=k.device)[-self.slots:]  # sequence indices
        keys.index_copy_(2, kept % self.slots, k[:, :, -self.slots:])
        values.index_copy_(2, kept % self.slots, v[:, :, -self.slots:])
        return seen_keys, seen_values

    def advance(self, T):
        """After the layers: count the T new tokens as held."""
        self.length += T


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.layer = layer  # this layer's index in a KV cache
        self.n_head = config.n_head
        self.n_kv_head = config.kv_heads
        self.head_size = config.head_size
        self.n_embd = config.n_embd
        self.kv_embd = config.kv_heads * config.head_size  # the width of K, and of V
        self.gqa = config.kv_heads != config.n_head  # grouped-query: several query heads share each K/V head
        self.window = config.window
        self.dropout = config.dropout
        self.backend = config.attn
        # Q = XW_Q, K = XW_K, V = XW_V as one fused matmul; K and V have n_kv_head heads each
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * self.kv_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.q_norm = RMSNorm(config.head_size) if config.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(config.head_size) if config.qk_norm else nn.Identity()

    def forward(self, x, rope=None, mask=None, cache=None, maps=None):
        """x (B, T, C); returns (B, T, C). maps, a list, gets this layer's attention weights (B, nh, T, S) appended,
        computed by the plain formula."""
        B, T, C = x.size()  # batch size, sequence length, embedding width (n_embd)
        q, k, v = self.c_attn(x).split([self.n_embd, self.kv_embd, self.kv_embd], dim=2)
        q = q.view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        q = self.q_norm(q)
        k = k.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2)  # (B, nkv, T, hs)
        k = self.k_norm(k)
        v = v.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2)  # (B, nkv, T, hs)
        if rope is not None:
            cos, sin = rope
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B, nkv, S, hs), S = slots read + T
        # mask None with T > 1: causal (band-causal with a window) over these T keys; T == 1 sees every key
        is_causal = mask is None and T > 1
        banded = is_causal and 0 < self.window < T  # a band narrower than T (padding: a full mask instead)
        dropout_p = self.dropout if self.training else 0.0
        if self.backend == "manual" or maps is not None:
            y, weights = manual_attention(q, k, v, mask, is_causal, dropout_p, self.window)
            if maps is not None:
                maps.append(weights)
        elif banded:  # O(T·W) by chunks
            y = banded_attention(q, k, v, self.window, dropout_p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                               enable_gqa=self.gqa)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, nh·hs): heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.relu2 = config.mlp == "relu2"

    def forward(self, x):
        x = self.c_fc(x)
        if self.relu2:
            x = F.relu(x).square()
        else:
            x = F.gelu(x, approximate="tanh")
        x = self.c_proj(x)
        return self.dropout(x)


class Block(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = make_norm(config, config.n_embd)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = make_norm(config, config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, rope=None, mask=None, cache=None, maps=None):
        x = x + self.attn(self.ln_1(x), rope, mask, cache, maps)
        x = x + self.mlp(self.ln_2(x))
        return x


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
        if config.ngram:
            # one table: order k's rows are (k - 2) * ngram_buckets onwards
            self.transformer.ngram = nn.Embedding((config.ngram - 1) * config.ngram_buckets, config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        if config.ngram:
            nn.init.zeros_(self.transformer.ngram.weight)  # training starts from the plain model's function
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: scale residual projections by 1/√(2·n_layer)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, embeddings=True):
        """Parameters counted once (a tied head counts once); without embeddings drops wte, wpe and the n-gram table."""
        skip = ()
        if not embeddings:
            skip = ("transformer.wte", "transformer.wpe", "transformer.ngram")
        return sum(p.numel() for name, p in self.named_parameters() if not name.startswith(skip))

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward): 6N for the matmuls plus 12·L·C·T for attention
        (PaLM, appendix B). N counts the output head but not the embedding lookups."""
        cfg = self.config
        T = seq_len or cfg.block_size
        n = self.num_params(embeddings=False)
        if cfg.tie_weights:
            n += self.lm_head.weight.numel()  # the tied head was skipped as wte, but its matmul runs
        keys = T
        if cfg.window:
            keys = min(T, cfg.window)  # a query sees at most window keys
        return 6 * n + 12 * cfg.n_layer * cfg.n_embd * keys

    @property
    def context_window(self):
        """The most tokens one forward pass reads: decoding slides its window within this."""
        return self.config.block_size

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, **kwargs):
        """idx (B, T) followed by max_new_tokens sampled tokens (attnlab.decode.generate: top_p, stop_tokens,
        generator, attention_mask and kv_cache too), as nanoGPT's GPT.generate is called."""
        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, **kwargs)

    def new_cache(self, batch_size, device, dtype):
        """An empty KV cache for batch_size sequences of up to context_window tokens."""
        return KVCache(self.config, batch_size, self.config.block_size, device, dtype)

    def attention_keys(self, query_pos, real, cache):
        """The keys that tokens at sequence indices query_pos (T,), real (B, T) False at padding (or None), attend
        to, for the mask and the positions; None where plain causal attention serves and positions are indices. A
        cache keeps the tokens' padding flags here."""
        if cache is not None:
            return cache.update_mask(query_pos, real)
        if real is None:
            return None
        return AttentionKeys(pos=query_pos, real=real, pads=(~real).cumsum(1))

    def forward(self, idx, targets=None, attention_mask=None, cache=None, last_logits_only=False, maps=None):
        """idx (B, T) token ids; attention_mask (B, T) True at real tokens (left padding); cache a KVCache
        continued from its filled positions; maps a list that gets each layer's attention weights (B, nh, T, S)
        appended (attention_maps). Returns logits (B, T, vocab) and the mean loss over real target positions (None
        without targets). A training step of a large vocabulary returns logits None (chunked_loss)."""
        T = idx.size(1)
        start = 0
        if cache is not None:
            start = cache.length
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than block_size={self.config.block_size}")
        query_pos = torch.arange(start, start + T, device=idx.device)  # (T,) each token's index in the sequence
        real = None
        if attention_mask is not None:
            real = attention_mask.bool()  # (B, T)
        keys = self.attention_keys(query_pos, real, cache)
        mask = None
        positions = query_pos[None]  # (1, T)
        if keys is not None:  # padding, or several queries continuing a cache
            mask = keys.mask(query_pos, self.config.window)  # (B, 1, T, S)
            positions = keys.positions(query_pos)  # (B, T): real tokens before each one
        x = self.transformer.wte(idx)  # (B, T, C)
        if self.config.ngram:
            x = x + self.ngram_embedding(idx, real, cache)  # (B, T, C)
        rope = None
        if self.config.pos == "learned":
            x = x + self.transformer.wpe(positions)
        elif self.config.pos == "sinusoidal":
            x = x + self.sinusoid[positions]
        elif self.config.pos == "rope":
            cos = self.rope_cos[positions][:, None]  # (B|1, 1, T, hs)
            sin = self.rope_sin[positions][:, None]  # (B|1, 1, T, hs)
            rope = (cos, sin)
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x, rope, mask, cache, maps)
        if cache is not None:
            cache.advance(T)
        if last_logits_only:
            x = x[:, -1:]  # (B, 1, C): only the next token's logits
        x = self.transformer.ln_f(x)
        if self.chunked_loss(x, targets):  # a large vocabulary's training step where its logits are best never held
            return None, chunked_lm_loss(x, self.lm_head.weight, targets, attention_mask, compute_dtype(x))
        logits = self.lm_head(x)  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = lm_loss(logits, targets, attention_mask)
        return logits, loss

    def ngram_embedding(self, idx, real, cache):
        """(B, T, C): for each token of idx (B, T), the sum of one row per n-gram ending at it, orders 2 to ngram,
        each n-gram hashed into its order's ngram_buckets rows. Tokens before the sequence and padding (real False)
        read as vocab_size, an id no text has; a cache holds the last ngram - 1 tokens of the calls before."""
        B, T = idx.shape
        n = self.config.ngram
        none = self.config.vocab_size
        if real is not None:
            idx = idx.masked_fill(~real, none)
        before = idx.new_full((B, n - 1), none)  # (B, n-1)
        if cache is not None and cache.tokens is not None:
            before = cache.tokens
        tokens = torch.cat([before, idx], 1)  # (B, n-1+T)
        if cache is not None:
            cache.tokens = tokens[:, -(n - 1):]
        rows = ngram_rows(tokens, n, self.config.ngram_buckets)  # (B, T, n-1)
        return self.transformer.ngram(rows).sum(2)  # (B, T, n-1, C) -> (B, T, C)

    def chunked_loss(self, x, targets):
        """Whether forward computes its loss in chunks and returns no logits: a training step (targets, gradients on)
        whose (B·T, vocab) logits chunks_pay says are better never held, for x (B, T, C) on its device."""
        training_step = targets is not None and torch.is_grad_enabled()
        return training_step and chunks_pay(x.device, x.size(0) * x.size(1), self.config.vocab_size)

    @torch.no_grad()
    def attention_maps(self, idx, attention_mask=None):
        """Each layer's attention weights (B, n_head, T, T), computed by the plain reference path."""
        maps = []
        self(idx, attention_mask=attention_mask, maps=maps)
        return maps
