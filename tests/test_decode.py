"""attnlab/decode.py, the one decoding loop, tested once for every model type (GPT, LSTM, GRU): cache == recomputation,
seeds, stop tokens, left padding, top-k / top-p, argument checks, and the context-overflow policy past block_size."""
import re

import pytest
import torch

from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from attnlab.decode import generate, sample_token

MODELS = ["gpt", "gpt-ngram", "lstm", "gru"]  # gpt-ngram: a GPT with n-gram embeddings (orders 2, 3)
VOCAB, W = 37, 16  # W: the GPT's block_size, its context window


def tiny(type):
    """A 2-layer model of width 32 whose matrices are drawn from N(0, 0.5): at the usual 0.02 init, greedy decoding
    repeats one token, which would hide a cache, padding or window bug."""
    torch.manual_seed(0)
    ngram = dict(ngram=3, ngram_buckets=64) if type == "gpt-ngram" else {}
    model = build_model(ModelConfig(type=type.removesuffix("-ngram"), vocab_size=VOCAB, block_size=W, n_layer=2,
                                    n_head=4, n_embd=32, **ngram))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.5)
    return model.eval()


def prompts(batch_size, length, seed=1):
    return torch.randint(0, VOCAB, (batch_size, length), generator=torch.Generator().manual_seed(seed))


def seeded(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("type", MODELS)
def test_greedy_is_the_same_with_and_without_the_cache(type):
    model, prompt = tiny(type), prompts(2, 5)
    # the GPT within one window (its last step reads W tokens); an RNN has no window, so past block_size too
    new = W - 5 + 1 if type.startswith("gpt") else 2 * W
    cached = model.generate(prompt, new, temperature=0)  # as nanoGPT's users call it
    assert cached.shape == (2, 5 + new) and torch.equal(cached[:, :5], prompt)
    assert len(set(cached[0, 5:].tolist())) > 3  # varied tokens, so that every step is checked
    assert torch.equal(cached, generate(model, prompt, new, temperature=0, kv_cache=False))


@pytest.mark.parametrize("type", MODELS)
def test_seeded_sampling_is_reproducible_and_seeds_differ(type):
    model, prompt = tiny(type), prompts(3, 4)
    kw = dict(temperature=1.0, top_k=10, top_p=0.95)
    a = generate(model, prompt, 20, generator=seeded(1), **kw)
    assert torch.equal(a, generate(model, prompt, 20, generator=seeded(1), **kw))
    assert not torch.equal(a, generate(model, prompt, 20, generator=seeded(2), **kw))


@pytest.mark.parametrize("type", MODELS)
def test_stop_tokens_end_every_sequence_and_pad_with_the_stop_token(type):
    model, prompt, n = tiny(type), prompts(3, 4), 40
    free = generate(model, prompt, n, generator=seeded(3))[:, 4:]  # the same draws with no stop tokens
    stops = set(free[:, 5].tolist())  # every row meets one by its sixth token, some rows earlier
    first = [next(i for i, t in enumerate(row) if t in stops) for row in free.tolist()]
    assert len(set(first)) > 1  # rows stop at different steps, so the early ones are padded
    # the reference: each row as it ran free up to its first stop token, then that token until the last row stops
    expected = torch.stack([torch.cat([row[:i + 1], row[i].repeat(max(first) - i)]) for row, i in zip(free, first)])
    stopped = generate(model, prompt, n, stop_tokens=stops, generator=seeded(3))
    assert torch.equal(stopped[:, 4:], expected) and stopped.shape[1] < 4 + n


@pytest.mark.parametrize("kv_cache", [True, False])
@pytest.mark.parametrize("type", MODELS)
def test_a_left_padded_batch_gives_each_row_its_tokens_alone(type, kv_cache):
    model, long, short = tiny(type), prompts(1, 8, seed=1), prompts(1, 5, seed=2)
    batch = torch.cat([long, torch.cat([torch.full((1, 3), 7), short], dim=1)])
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, :3] = False
    new = W - 8 + 1  # within the GPT's window: past it the batch slides its window at the longest row's pace
    out = generate(model, batch, new, temperature=0, attention_mask=mask, kv_cache=kv_cache)
    assert torch.equal(out[0], generate(model, long, new, temperature=0, kv_cache=kv_cache)[0])
    assert torch.equal(out[1, 3:], generate(model, short, new, temperature=0, kv_cache=kv_cache)[0])


@pytest.mark.parametrize("type", MODELS)
def test_top_k_1_equals_greedy(type):
    model, prompt = tiny(type), prompts(2, 5)
    greedy = generate(model, prompt, 12, temperature=0)
    assert torch.equal(generate(model, prompt, 12, temperature=1.5, top_k=1, generator=seeded(0)), greedy)


def test_top_k_and_top_p_draw_only_allowed_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]]))  # one row, then it reversed

    def draws(**kw):
        rows = torch.stack([sample_token(logits, generator=seeded(s), **kw) for s in range(300)])  # (300, 2)
        return set(rows[:, 0].tolist()), set(rows[:, 1].tolist())

    assert draws(top_k=2) == ({0, 1}, {3, 2})
    assert draws(top_p=0.7) == ({0, 1}, {3, 2})  # 0.5 alone is short of 0.7; 0.5 + 0.3 covers it
    assert draws(top_p=0.4) == ({0}, {3})
    assert draws(top_k=3, top_p=0.9) == ({0, 1, 2}, {3, 2, 1})
    assert draws(top_k=2, top_p=1.0, temperature=5.0) == ({0, 1}, {3, 2})  # a flatter distribution, same cut
    assert draws(temperature=0) == ({0}, {3})
    assert draws() == ({0, 1, 2, 3}, {0, 1, 2, 3})


def test_sampling_draws_tokens_at_their_probabilities_as_torch_multinomial_does():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = probs.log().expand(40_000, -1)  # one distribution in every row, a zero-probability token last
    drawn = sample_token(logits, generator=seeded(0))
    assert torch.allclose(torch.bincount(drawn, minlength=5) / len(drawn), probs, atol=0.01)  # 4 sigma at p = 0.5
    assert (drawn != 4).all()
    for seed in range(20):  # the same tokens as multinomial for the same generator, so a seed keeps its text
        rows = torch.randn(3, 11, generator=seeded(100 + seed))
        assert torch.equal(sample_token(rows, generator=seeded(seed)),
                           torch.multinomial(rows.softmax(-1), 1, generator=seeded(seed))[:, 0])


@pytest.mark.parametrize("type", ["gpt", "lstm"])
@pytest.mark.parametrize("kw, message", [
    (dict(max_new_tokens=-1), "max_new_tokens=-1 must be >= 0"),
    (dict(temperature=-0.5), "temperature=-0.5 must be >= 0 (0 is greedy)"),
    (dict(top_k=0), "top_k=0 must be >= 1"),
    (dict(top_p=0.0), "top_p=0.0 must be in (0, 1]"), (dict(top_p=1.5), "top_p=1.5 must be in (0, 1]")])
def test_bad_sampling_arguments_name_the_fix(type, kw, message):
    args = {"max_new_tokens": 3, **kw}
    with pytest.raises(ValueError, match=re.escape(message)):
        generate(tiny(type), prompts(1, 2), **args)


def reference_greedy(model, prompt, max_new_tokens, kv_cache):
    """Greedy decoding by plain full forward passes (no cache), each over the context that generate_stream's
    docstring promises. With the cache: the prompt's last W tokens, growing by one token a step; once it holds W,
    the last W // 2, growing again up to W. Without it: always the last W tokens."""
    tokens, start = prompt, max(0, prompt.size(1) - W)
    for end in range(prompt.size(1), prompt.size(1) + max_new_tokens):  # tokens[:, :end] are known
        if not kv_cache:
            start = max(0, end - W)
        elif end - start > W:
            start = end - W // 2
        logits = model(tokens[:, start:end])[0][:, -1]  # (B, vocab)
        tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], dim=1)
    return tokens


@pytest.mark.parametrize("type", ["gpt", "gpt-ngram"])
@pytest.mark.parametrize("prompt_len", [5, W + 4])  # a prompt shorter and one longer than the window
def test_decoding_past_the_window_follows_the_documented_policy(prompt_len, type):
    model, prompt, new = tiny(type), prompts(2, prompt_len), 3 * W + 5
    cached = model.generate(prompt, new, temperature=0)  # as nanoGPT's users call it
    recomputed = generate(model, prompt, new, temperature=0, kv_cache=False)
    assert torch.equal(cached, reference_greedy(model, prompt, new, kv_cache=True))
    assert torch.equal(recomputed, reference_greedy(model, prompt, new, kv_cache=False))
    assert len(set(cached[0, prompt_len:].tolist())) > 3
    # the two policies read the same context until the cache first refills, and differ after it
    same_until = W - prompt_len + 1 if prompt_len < W else 1
    assert torch.equal(cached[:, :prompt_len + same_until], recomputed[:, :prompt_len + same_until])
    assert not torch.equal(cached, recomputed)
