"""Sliding-window attention (GPTConfig.window) against independent references: the band formula on every path, the
receptive field it implies, the ring-buffer KV cache against recomputation, and its constant memory."""
import math
from dataclasses import replace

import pytest
import torch
from conftest import TINY, compose, tiny_config

from attnlab.decode import generate
from model import GPT, GPTConfig, apply_rope, banded_attention, rope_tables
from train import train

VOCAB, BLOCK = 37, 32


def tiny(window, **kw):
    """A 2-layer GPT whose matrices are drawn from N(0, 0.5), so that greedy decoding varies and logits differ."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**dict(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_head=4, n_embd=32,
                                    window=window), **kw})).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.5)
    return model


def band(T, window):
    """(T, T): key j visible to query i iff i - window < j <= i, written with triangles."""
    ones = torch.ones(T, T, dtype=torch.bool)
    return ones.tril() & ~ones.tril(-window)


def formula(q, k, v, window):
    """softmax(QKᵀ/√d + band)V per head; q (B, nh, T, hs), k and v (B, nkv, T, hs), each K/V head shared in turn."""
    groups = q.size(1) // k.size(1)
    heads = []
    for h in range(q.size(1)):
        scores = q[:, h] @ k[:, h // groups].transpose(-2, -1) / math.sqrt(q.size(-1))
        scores = scores.masked_fill(~band(q.size(2), window), float("-inf"))
        heads.append(scores.softmax(-1) @ v[:, h // groups])
    return torch.stack(heads, 1)


@pytest.mark.parametrize("window", [1, 3, 4])
@pytest.mark.parametrize("T", [2, 4, 7, 8, 9, 13])  # within, at and past one and two chunks
@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_chunked_attention_equals_the_band_formula(window, T, n_kv_head):
    torch.manual_seed(T)
    q, k, v = torch.randn(2, 4, T, 8), torch.randn(2, n_kv_head, T, 8), torch.randn(2, n_kv_head, T, 8)
    torch.testing.assert_close(banded_attention(q, k, v, window), formula(q, k, v, window), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn", ["sdpa", "manual"])
@pytest.mark.parametrize("T", [3, 4, 8, 9, 19])  # window 4: plain causal, the band alone, chunks past 2W
@pytest.mark.parametrize("n_kv_head, rope", [(None, True), (2, True), (2, False)])
def test_the_layer_equals_the_band_formula(attn, T, n_kv_head, rope):
    model = tiny(4, attn=attn, n_kv_head=n_kv_head, qk_norm=False)
    layer = model.transformer.h[0].attn
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(T))
    cos, sin = (table[:T][None, None] for table in rope_tables(T, 8, 10000.0))
    y = layer(x, rope=(cos, sin) if rope else None)
    q, k, v = layer.c_attn(x).split([32, 8 * layer.n_kv_head, 8 * layer.n_kv_head], dim=2)
    q, k, v = (t.view(2, T, -1, 8).transpose(1, 2) for t in (q, k, v))
    if rope:
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    expected = layer.c_proj(formula(q, k, v, 4).transpose(1, 2).reshape(2, T, 32))
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_chunked_sdpa_and_the_manual_band_agree_on_the_whole_model(pos):
    a, b = tiny(5, pos=pos, n_kv_head=2), tiny(5, pos=pos, n_kv_head=2, attn="manual")
    x = torch.randint(0, VOCAB, (2, 27))
    torch.testing.assert_close(a(x)[0], b(x)[0], atol=1e-4, rtol=1e-4)


def test_attention_maps_are_distributions_over_the_band():
    maps = tiny(3).attention_maps(torch.randint(0, VOCAB, (2, 12)))
    for w in maps:
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 12))
        assert torch.equal(w > 0, band(12, 3).expand_as(w))  # every key in the band gets weight, none outside


@pytest.mark.parametrize("attn", ["sdpa", "manual"])
@pytest.mark.parametrize("window", [12, 40])
def test_a_window_as_long_as_the_sequence_is_full_causal_attention(attn, window):
    x = torch.randint(0, VOCAB, (2, 12))
    torch.testing.assert_close(tiny(window, attn=attn)(x)[0], tiny(0, attn=attn)(x)[0], atol=0, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "manual"])
@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_the_receptive_field_is_n_layer_windows(attn, pos):
    """With window 3 and 2 layers the last token reads 2 * (3 - 1) = 4 tokens back, and nothing further."""
    x = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(3))

    def last_logit_changes(model, back):
        changed = x.clone()
        changed[0, -1 - back] = (changed[0, -1 - back] + 1) % VOCAB
        return not torch.allclose(model(x)[0][0, -1], model(changed)[0][0, -1], atol=1e-6, rtol=0)

    windowed, full = tiny(3, pos=pos, attn=attn), tiny(0, pos=pos, attn=attn)
    assert last_logit_changes(windowed, 4)
    assert not any(last_logit_changes(windowed, back) for back in range(5, 20))
    assert all(last_logit_changes(full, back) for back in (5, 10, 19))


def cached_logits(model, x, pieces, mask=None):
    """Logits of x fed through one cache in pieces of the given lengths, then one token at a time."""
    cache, out, start = model.new_cache(x.size(0), "cpu", torch.float32), [], 0
    for end in [*torch.tensor(pieces).cumsum(0).tolist(), *range(sum(pieces) + 1, x.size(1) + 1)]:
        piece_mask = None if mask is None else mask[:, start:end]
        out.append(model(x[:, start:end], attention_mask=piece_mask, cache=cache)[0])
        start = end
    return torch.cat(out, 1)


@pytest.mark.parametrize("pieces", [[2], [4], [11], [11, 7], [3, 9]])  # prompts shorter and longer than the window
@pytest.mark.parametrize("n_kv_head", [None, 2])
@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_the_windowed_cache_equals_a_full_forward(pieces, n_kv_head, pos):
    model = tiny(4, pos=pos, n_kv_head=n_kv_head)
    x = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(cached_logits(model, x, pieces), model(x)[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pieces", [[5], [11], [11, 7]])
def test_the_windowed_cache_with_a_left_padded_batch(pieces):
    model = tiny(4, n_kv_head=2)
    x = torch.randint(0, VOCAB, (2, BLOCK), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, BLOCK, dtype=torch.bool)
    mask[1, :6] = False
    full = model(x, attention_mask=mask)[0]
    torch.testing.assert_close(cached_logits(model, x, pieces, mask)[mask], full[mask], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("prompt_len", [2, 11])
def test_greedy_decoding_with_the_windowed_cache_equals_recomputation(prompt_len):
    model = tiny(4)
    prompt = torch.randint(0, VOCAB, (2, prompt_len), generator=torch.Generator().manual_seed(1))
    out = generate(model, prompt, BLOCK - prompt_len, temperature=0)
    assert all(len(set(row.tolist())) > 3 for row in out[:, prompt_len:])  # varied tokens: every step is checked
    assert torch.equal(out[:, prompt_len:], model(out[:, :-1])[0][:, prompt_len - 1:].argmax(-1))
    assert torch.equal(out, generate(model, prompt, BLOCK - prompt_len, temperature=0, kv_cache=False))


def test_a_left_padded_batch_decodes_each_row_as_alone():
    model = tiny(4)
    long, short = (torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(4 * n)) for n in (9, 6))
    batch = torch.cat([long, torch.cat([torch.full((1, 3), 7), short], dim=1)])
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False
    out = generate(model, batch, BLOCK - 9, temperature=0, attention_mask=mask)
    assert all(len(set(row.tolist())) > 3 for row in out[:, -12:])  # still varied past the ring's first laps
    assert torch.equal(out[0], generate(model, long, BLOCK - 9, temperature=0)[0])
    assert torch.equal(out[1, 3:], generate(model, short, BLOCK - 9, temperature=0)[0])


def test_the_windowed_cache_holds_window_tokens_however_many_are_generated():
    model, B, window = tiny(4, n_kv_head=2), 2, 4
    cache = model.new_cache(B, "cpu", torch.float32)
    expected = 2 * 2 * 2 * 8 * window * 4 * B  # K and V, n_layer, n_kv_head, head_size, window, float32 bytes, B
    assert cache.nbytes == expected
    x = torch.randint(0, VOCAB, (B, BLOCK))
    model(x[:, :10], cache=cache)
    for t in range(10, BLOCK):
        model(x[:, t:t + 1], cache=cache)
        assert cache.nbytes == expected and cache.k.shape[-2] == window
    assert tiny(0, n_kv_head=2).new_cache(B, "cpu", torch.float32).nbytes == expected * BLOCK // window


@pytest.mark.parametrize("make", [lambda: GPTConfig(window=-1), lambda: compose("model.window=-1")])
def test_a_negative_window_names_the_fix(make):
    with pytest.raises(ValueError, match=r"^window=-1 must be >= 0; use 0 for full causal attention$"):
        make()


def test_the_command_line_sets_the_window_and_a_windowed_model_trains(tmp_path, one_thread):
    assert compose(*TINY, "model.window=8").model.architecture().window == 8
    cfg = tiny_config(tmp_path, max_iters=3, eval_interval=3)
    summary = train(replace(cfg, model=replace(cfg.model, window=8)))
    assert summary["iters"] == 3 and math.isfinite(summary["val_loss"])
