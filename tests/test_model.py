"""model.py against independent references: the attention formula, causality, positions, the KV cache, padding."""
import math

import pytest
import torch

from attnlab import loss as loss_module
from attnlab.loss import CHUNKED_LOSS_VOCAB, chunked_lm_loss
from model import (
    GPT,
    GPTConfig,
    KVCache,
    RMSNorm,
    apply_rope,
    lm_loss,
    ngram_rows,
    rope_tables,
)

POS = ["rope", "learned", "sinusoidal", "none"]
ATTN = ["sdpa", "manual"]


def tiny(**kw):
    cfg = dict(vocab_size=37, block_size=32, n_layer=2, n_head=4, n_embd=32)
    cfg.update(kw)
    torch.manual_seed(0)
    return GPT(GPTConfig(**cfg)).eval()


def with_ngrams(n, **kw):
    """A tiny model with n-gram embeddings of orders 2..n in 16 rows each, drawn at random: at their initial zeros
    they would change nothing."""
    model = tiny(ngram=n, ngram_buckets=16, **kw)
    torch.nn.init.normal_(model.transformer.ngram.weight)
    return model


@pytest.mark.parametrize("attn", ATTN)
@pytest.mark.parametrize("n_kv_head, qk_norm", [(None, False), (2, False), (None, True)])
def test_attention_equals_plain_softmax_formula(attn, n_kv_head, qk_norm):
    model = tiny(attn=attn, n_kv_head=n_kv_head, pos="none", qk_norm=qk_norm)
    layer = model.transformer.h[0].attn
    x = torch.randn(2, 9, 32)
    y = layer(x)
    # the reference, written from the formula: per head softmax(QKᵀ/√d_k + causal mask)V, concat, project
    q, k, v = layer.c_attn(x).split([32, 8 * layer.n_kv_head, 8 * layer.n_kv_head], dim=2)
    heads = []
    for h in range(4):
        kv = h // (4 // layer.n_kv_head)
        qh, kh, vh = q[..., 8 * h:8 * h + 8], k[..., 8 * kv:8 * kv + 8], v[..., 8 * kv:8 * kv + 8]
        qh, kh = layer.q_norm(qh), layer.k_norm(kh)  # with qk_norm, each head's q and k RMS-normalised; else as is
        scores = qh @ kh.transpose(1, 2) / math.sqrt(8)
        scores = scores.masked_fill(torch.ones(9, 9).triu(1).bool(), float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ vh)
    expected = layer.c_proj(torch.cat(heads, dim=-1))
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)


def test_attention_maps_are_causal_distributions():
    model = tiny(attn="manual")
    x = torch.randint(0, 37, (2, 12))
    maps = model.attention_maps(x)
    assert len(maps) == 2 and maps[0].shape == (2, 4, 12, 12)
    for w in maps:
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 12))
        assert (w.triu(1) == 0).all()
    # collecting the weights changes nothing the forward pass returns: one shape, (logits, loss), the same values
    logits, loss = model(x, x)
    collected = []
    assert all(torch.equal(a, b) for a, b in zip(model(x, x, maps=collected), (logits, loss)))
    assert all(torch.equal(a, b) for a, b in zip(collected, maps))


@pytest.mark.parametrize("attn", ATTN)
@pytest.mark.parametrize("pos", POS)
def test_future_tokens_do_not_change_past_logits(attn, pos):
    model = tiny(attn=attn, pos=pos)
    x = torch.randint(0, 37, (1, 20))
    changed = x.clone()
    changed[0, 11:] = (changed[0, 11:] + 5) % 37
    a, b = model(x)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :11], b[:, :11], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 11:], b[:, 11:])


def attention_stack(model, x):
    """The attention sublayers alone (no MLP, no causal mask), to test what order information they get."""
    h = model.transformer.wte(x)
    if model.config.pos == "learned":
        h = h + model.transformer.wpe(torch.arange(x.size(1)))
    if model.config.pos == "sinusoidal":
        h = h + model.sinusoid[: x.size(1)]
    rope = None
    if model.config.pos == "rope":
        rope = (model.rope_cos[: x.size(1)][None, None], model.rope_sin[: x.size(1)][None, None])
    full = torch.ones(x.size(1), x.size(1), dtype=torch.bool)
    for block in model.transformer.h:
        h = h + block.attn(block.ln_1(h), rope, full)
    return h


@pytest.mark.parametrize("pos", POS)
def test_only_position_encodings_make_attention_order_aware(pos):
    model = tiny(pos=pos)
    x = torch.randint(0, 37, (1, 10))
    perm = torch.randperm(10)
    out, out_perm = attention_stack(model, x), attention_stack(model, x[:, perm])
    equivariant = torch.allclose(out[:, perm], out_perm, atol=1e-5)
    assert equivariant == (pos == "none")


def test_rope_scores_depend_only_on_relative_offset():
    cos, sin = rope_tables(64, 16, 10000.0)
    q, k = torch.randn(16), torch.randn(16)

    def score(i, j):
        qi = apply_rope(q.view(1, 1, 1, 16), cos[i].view(1, 1, 1, 16), sin[i].view(1, 1, 1, 16))
        kj = apply_rope(k.view(1, 1, 1, 16), cos[j].view(1, 1, 1, 16), sin[j].view(1, 1, 1, 16))
        return (qi * kj).sum()

    torch.testing.assert_close(score(7, 3), score(40, 36), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(score(7, 3), score(7, 5))
    # the rotation itself: pair (q[d], q[d + 8]) turns by position * base^(-d/8)
    angle = 5 * 10000.0 ** (-torch.arange(8) / 8)
    rotated = torch.cat([q[:8] * angle.cos() - q[8:] * angle.sin(), q[8:] * angle.cos() + q[:8] * angle.sin()])
    torch.testing.assert_close(apply_rope(q, cos[5], sin[5]), rotated)


def cached_logits(model, x, prefill, mask=None):
    cache = model.new_cache(x.size(0), "cpu", torch.float32)
    pieces = [model(x[:, :prefill], attention_mask=None if mask is None else mask[:, :prefill], cache=cache)[0]]
    for t in range(prefill, x.size(1)):
        pieces.append(model(x[:, t:t + 1], cache=cache)[0])
    return torch.cat(pieces, dim=1)


@pytest.mark.parametrize("pos", POS)
@pytest.mark.parametrize("n_kv_head", [None, 1])
def test_kv_cache_prefill_and_decode_equal_full_forward(pos, n_kv_head):
    model = tiny(pos=pos, n_kv_head=n_kv_head)
    x = torch.randint(0, 37, (2, 24))
    torch.testing.assert_close(cached_logits(model, x, 10), model(x)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("pos", POS)
def test_kv_cache_with_left_padded_batch(pos):
    model = tiny(pos=pos, n_kv_head=2)
    x = torch.randint(0, 37, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, :6] = False
    full = model(x, attention_mask=mask)[0]
    torch.testing.assert_close(cached_logits(model, x, 9, mask)[mask], full[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("window, ngram", [(0, 0), (4, 0), (0, 3)])
def test_the_cache_takes_pieces_padding_and_single_tokens_in_any_order(window, ngram):
    model = with_ngrams(ngram, n_kv_head=2, window=window) if ngram else tiny(n_kv_head=2, window=window)
    x = torch.randint(0, 37, (2, 24), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 24, dtype=torch.bool)
    mask[1, 5:8] = False  # padding first met by the third call, after tokens the cache held without a mask
    cache = model.new_cache(2, "cpu", torch.float32)

    def through_cache():
        pieces, start = [], 0
        for end in (4, 5, 11, 12, 13, 19, 20, 24):  # several tokens, one, several continuing, one after them, ...
            piece_mask = mask[:, start:end]
            if piece_mask.all():
                piece_mask = None
            pieces.append(model(x[:, start:end], attention_mask=piece_mask, cache=cache)[0])
            start = end
        cache.clear()
        return torch.cat(pieces, 1)

    cached = through_cache()
    torch.testing.assert_close(cached[mask], model(x, attention_mask=mask)[0][mask], atol=1e-5, rtol=0)
    assert torch.equal(through_cache(), cached)  # a cleared cache computes what a new one does


@pytest.mark.parametrize("attn", ATTN)
@pytest.mark.parametrize("pos", POS)
def test_left_padding_gives_each_sequence_its_own_logits(attn, pos):
    model = tiny(attn=attn, pos=pos)
    a, b = torch.randint(0, 37, (1, 15)), torch.randint(0, 37, (1, 9))
    batch = torch.cat([a, torch.cat([torch.zeros(1, 6, dtype=torch.long), b], dim=1)])
    mask = torch.ones(2, 15, dtype=torch.bool)
    mask[1, :6] = False
    logits = model(batch, attention_mask=mask)[0]
    torch.testing.assert_close(logits[0], model(a)[0][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[1, 6:], model(b)[0][0], atol=1e-5, rtol=0)


def test_ngram_embeddings_read_each_token_with_the_ones_before_it_only():
    model = with_ngrams(3)
    x = torch.randint(0, 37, (1, 20))
    changed = x.clone()
    changed[0, 11] = (x[0, 11] + 5) % 37
    a, b = model(x)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :11], b[:, :11], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 11:], b[:, 11:])
    # token 11's bigram and trigram, token 12's two and token 13's trigram hold it; no n-gram further on does
    moved = (model.ngram_embedding(x, None, None) != model.ngram_embedding(changed, None, None)).any(-1)[0]
    assert moved.nonzero().flatten().tolist() == [11, 12, 13]


def test_ngram_rows_give_each_order_its_own_rows_from_its_last_tokens():
    tokens = torch.tensor([[1, 2, 3, 4]])  # three tokens of context, then one token
    rows = ngram_rows(tokens, 4, 1000)  # (1, 1, 3): its bigram, trigram and 4-gram
    h2 = (4 * 1_000_003 + 3) % (2**31 - 1)  # the hash, written out: part of what a checkpoint's tables mean
    h3 = (h2 * 1_000_003 + 2) % (2**31 - 1)
    h4 = (h3 * 1_000_003 + 1) % (2**31 - 1)
    assert rows.tolist() == [[[h2 % 1000, 1000 + h3 % 1000, 2000 + h4 % 1000]]]
    other = ngram_rows(torch.tensor([[9, 2, 3, 4]]), 4, 1000)  # only the 4-gram differs
    assert other[0, 0, :2].tolist() == rows[0, 0, :2].tolist() and other[0, 0, 2] != rows[0, 0, 2]
    huge = ngram_rows(torch.tensor([[2**31 - 2, 5, 2**31 - 3, 7, 2**31 - 4]]), 4, 10)  # ids near 2^31: no overflow
    assert huge.shape == (1, 2, 3)
    assert all(((huge[..., k] >= 10 * k) & (huge[..., k] < 10 * (k + 1))).all() for k in range(3))


@pytest.mark.parametrize("prefill", [1, 2, 10])
def test_the_cache_carries_the_tokens_that_the_next_ngrams_need(prefill):
    model = with_ngrams(4)
    x = torch.randint(0, 37, (2, 24))
    torch.testing.assert_close(cached_logits(model, x, prefill), model(x)[0], atol=1e-5, rtol=0)


def test_ngram_embeddings_read_padding_as_the_start_of_a_sequence():
    model = with_ngrams(3)
    a, b = torch.randint(0, 37, (1, 15)), torch.randint(0, 37, (1, 9))
    batch = torch.cat([a, torch.cat([torch.randint(0, 37, (1, 6)), b], dim=1)])
    mask = torch.ones(2, 15, dtype=torch.bool)
    mask[1, :6] = False
    logits = model(batch, attention_mask=mask)[0]
    torch.testing.assert_close(logits[0], model(a)[0][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[1, 6:], model(b)[0][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(cached_logits(model, batch, 8, mask)[mask], logits[mask], atol=1e-5, rtol=0)


def test_ngram_embeddings_run_on_the_meta_device_and_sum_in_fp32_under_bf16_autocast():
    with torch.device("meta"):  # shapes and dtypes through the whole forward pass, with no data and no host read
        meta = GPT(GPTConfig(vocab_size=37, block_size=32, n_layer=2, n_head=4, n_embd=32, ngram=4))
        logits, loss = meta(torch.zeros(2, 16, dtype=torch.long), torch.zeros(2, 16, dtype=torch.long))
    assert logits.shape == (2, 16, 37) and loss.shape == () and loss.device.type == "meta"
    model = with_ngrams(4)
    x = torch.randint(0, 37, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = model.ngram_embedding(x, None, None)
    exact = model.double().ngram_embedding(x, None, None)  # (B, T, C) in fp64
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed.double(), exact, atol=1e-6, rtol=0)


def test_padding_is_excluded_from_the_loss():
    model = tiny()
    b = torch.randint(0, 37, (1, 9))
    padded = torch.cat([torch.full((1, 4), 3), b], dim=1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.bool), torch.ones(1, 9, dtype=torch.bool)], dim=1)
    targets = torch.cat([torch.full((1, 4), 5), torch.randint(0, 37, (1, 9))], dim=1)
    padded_loss = model(padded, targets, attention_mask=mask)[1]
    torch.testing.assert_close(padded_loss, model(b, targets[:, 4:])[1], atol=1e-5, rtol=0)


def test_loss_at_init_is_near_uniform_and_one_batch_overfits():
    torch.manual_seed(0)
    model = tiny(vocab_size=65).train()
    x, y = torch.randint(0, 65, (4, 32)), torch.randint(0, 65, (4, 32))
    loss = model(x, y)[1]
    assert abs(loss.item() - math.log(65)) < 0.1
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = model(x, y)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1


def test_weight_tying_parameter_counts_and_flops():
    model = tiny()
    assert model.lm_head.weight is model.transformer.wte.weight
    blocks = sum(p.numel() for p in model.transformer.h.parameters()) + 32  # + ln_f weight
    assert model.num_params(embeddings=False) == blocks
    assert model.num_params() == blocks + 37 * 32
    assert GPT(GPTConfig(vocab_size=37, block_size=32, n_layer=2, n_head=4, n_embd=32, tie_weights=False)
               ).num_params() == blocks + 2 * 37 * 32
    assert model.flops_per_token() == 6 * (blocks + 37 * 32) + 12 * 2 * 32 * 32
    ngrams = tiny(ngram=3, ngram_buckets=16)  # lookups, not matmuls: parameters, but no FLOPs
    assert ngrams.num_params() == model.num_params() + 2 * 16 * 32
    assert ngrams.num_params(embeddings=False) == blocks and ngrams.flops_per_token() == model.flops_per_token()


def test_new_cache_holds_one_context_window():
    model = tiny(n_kv_head=2)
    cache = model.new_cache(3, "cpu", torch.float16)
    assert model.context_window == 32 and isinstance(cache, KVCache) and cache.length == 0
    assert cache.k.shape == cache.v.shape == (2, 3, 2, 32, 8) and cache.k.dtype == torch.float16  # (L, B, nkv, W, hs)


def ring_cache(batch_size):
    """A one-layer cache of 4 slots (window=4): sequence index p in slot p % 4."""
    config = GPTConfig(vocab_size=37, block_size=32, n_layer=1, n_head=2, n_embd=16, window=4)
    return KVCache(config, batch_size, 32, "cpu", torch.float32)


def test_the_cache_steps_name_the_keys_each_call_sees_and_count_padding():
    cache = ring_cache(2)
    prompt = torch.arange(6)
    real = torch.ones(2, 6, dtype=torch.bool)
    real[1, :3] = False  # row 1: three padding tokens, then three real ones
    assert cache.update_mask(prompt) is None  # a first call without padding: plain causal attention
    assert cache.key_mask is None and cache.pads is None  # no flags kept
    keys = cache.update_mask(prompt, real)
    assert keys.pos.tolist() == [0, 1, 2, 3, 4, 5]  # no slot filled yet: the tokens' own keys
    assert keys.positions(prompt).tolist() == [[0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 1, 2]]
    # the last four tokens' flags (2..5) in slots 2, 3, 0, 1; row 1's token 2 is padding
    assert cache.pads.tolist() == [[0], [3]]
    assert cache.key_mask.tolist() == [[True] * 4, [True, True, False, True]]
    assert cache.length == 0  # counting is advance's job
    cache.advance(6)
    assert cache.length == 6
    # one token is stored in slot 6 % 4 = 2 first, then read with the other three; kept flags mean a mask
    keys = cache.update_mask(torch.tensor([6]))
    assert keys.pos.tolist() == [4, 5, 6, 3]
    assert keys.real.tolist() == [[True] * 4, [True] * 4]  # slot 2 holds the new token's flag, not token 2's
    assert keys.positions(torch.tensor([6])).tolist() == [[6], [3]]
    cache.advance(1)
    # several tokens read the four filled slots, then their own keys
    assert cache.update_mask(torch.arange(7, 10)).pos.tolist() == [4, 5, 6, 3, 7, 8, 9]
    cache.clear()
    assert cache.length == 0 and cache.key_mask is None and cache.update_mask(torch.arange(3)) is None


def test_the_cache_needs_a_mask_for_padding_and_continuations_only():
    cache = ring_cache(1)
    assert cache.update_mask(torch.arange(3)) is None
    cache.advance(3)
    assert cache.update_mask(torch.tensor([3])) is None  # one token sees every slot read: no mask
    cache.advance(1)
    keys = cache.update_mask(torch.arange(4, 6))  # several continuing the cache must not see each other's future
    assert keys.pos.tolist() == [0, 1, 2, 3, 4, 5] and keys.real.all()
    cache.advance(2)
    assert cache.update_mask(torch.tensor([6])) is not None  # flags kept from then on


def test_the_cache_update_writes_the_ring_and_returns_the_keys_the_queries_see():
    cache = ring_cache(1)
    k = torch.arange(6.0).view(1, 1, 6, 1).expand(1, 2, 6, 8)  # each key holds its sequence index
    seen_k, seen_v = cache.update(0, k, k + 100)
    assert torch.equal(seen_k, k) and torch.equal(seen_v, k + 100)  # a first call sees its own keys
    cache.advance(6)
    assert cache.k[0, 0, 0, :, 0].tolist() == [4, 5, 2, 3]  # the last four, in slot p % 4
    seen_k, seen_v = cache.update(0, torch.full((1, 2, 1, 8), 6.0), torch.full((1, 2, 1, 8), 106.0))
    assert seen_k[0, 0, :, 0].tolist() == [4, 5, 6, 3] and seen_v[0, 0, :, 0].tolist() == [104, 105, 106, 103]
    cache.advance(1)
    seen_k, _ = cache.update(0, k[:, :, :2] + 7, k[:, :, :2] + 107)  # two more, seen after the four slots
    assert seen_k[0, 0, :, 0].tolist() == [4, 5, 6, 3, 7, 8]


@pytest.mark.parametrize("kw, message", [
    (dict(n_embd=130, n_head=4), "n_embd=130 is not divisible by n_head=4"),
    (dict(n_embd=36, n_head=4, pos="rope"), "RoPE needs an even head size"),
    (dict(n_head=4, n_kv_head=3), "not a multiple of n_kv_head=3"),
    (dict(pos="alibi"), "pos='alibi' is unknown"), (dict(attn="flash"), "attn='flash' is unknown"),
    (dict(dropout=1.0), "dropout"), (dict(block_size=0), "block_size"),
    (dict(ngram=1), "ngram=1 must be 0"), (dict(ngram_buckets=0), "ngram_buckets=0 must be positive")])
def test_bad_configs_name_the_fix(kw, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**kw)


@pytest.mark.parametrize("n_kv_head", [None, 2])
def test_sdpa_and_manual_backends_agree(n_kv_head):
    a, b = tiny(attn="sdpa", n_kv_head=n_kv_head), tiny(attn="manual", n_kv_head=n_kv_head)
    x = torch.randint(0, 37, (2, 16))
    torch.testing.assert_close(a(x)[0], b(x)[0], atol=1e-5, rtol=0)


@pytest.mark.filterwarnings("error")
def test_rmsnorm_under_bf16_autocast_runs_in_fp32_without_a_warning():
    torch.manual_seed(0)
    norm = RMSNorm(64)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 16, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x.bfloat16())  # bf16 in, fp32 gain: the case torch's fused kernel warned about
    assert y.dtype == torch.bfloat16  # computed in fp32, returned in the input's dtype
    assert torch.equal(y, norm(x.bfloat16().float()).bfloat16())
    reference = torch.nn.RMSNorm(64)
    reference.load_state_dict(norm.state_dict())
    assert torch.equal(norm(x), reference(x))  # in fp32, exactly nn.RMSNorm's arithmetic


@pytest.mark.parametrize("masked", [False, True])
def test_the_chunked_loss_equals_the_plain_one_with_its_gradients(masked):
    torch.manual_seed(0)
    h = torch.randn(2, 300, 32, requires_grad=True)
    weight = torch.randn(9000, 32, requires_grad=True)  # 1,000 rows a chunk would be more than one chunk
    targets = torch.randint(0, 9000, (2, 300))
    targets[0, :5] = -1
    mask = torch.ones(2, 300, dtype=torch.bool)
    if masked:
        mask[1, :7] = False
    plain = lm_loss(torch.nn.functional.linear(h, weight), targets, mask)
    chunked = chunked_lm_loss(h, weight, targets, mask)
    assert torch.allclose(plain, chunked, atol=1e-6)
    for a, b in zip(torch.autograd.grad(plain, [h, weight]), torch.autograd.grad(chunked, [h, weight])):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)


def test_a_large_vocabulary_trains_on_the_chunked_loss_to_the_same_gradients(monkeypatch):
    config = GPTConfig(vocab_size=CHUNKED_LOSS_VOCAB, block_size=16, n_layer=1, n_head=2, n_embd=16)
    torch.manual_seed(0)
    model = GPT(config)
    x = torch.randint(0, config.vocab_size, (2, 16))
    y = torch.randint(0, config.vocab_size, (2, 16))
    logits, loss = model(x, y)
    assert logits is None  # the step never holds the (B·T, vocab) logits
    chunked = torch.autograd.grad(loss, list(model.parameters()))
    with torch.no_grad():
        assert model(x, y)[0].shape == (2, 16, config.vocab_size)  # evaluation still gets them
    monkeypatch.setattr(loss_module, "CHUNKED_LOSS_VOCAB", 10 ** 9)  # the plain path, for reference
    logits, plain_loss = model(x, y)
    assert logits is not None and torch.allclose(loss, plain_loss, atol=1e-6)
    plain = torch.autograd.grad(plain_loss, list(model.parameters()))
    assert all(torch.allclose(a, b, atol=1e-5, rtol=0) for a, b in zip(chunked, plain))
