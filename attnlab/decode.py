"""Decoding: one loop that generates from any model with the language-model interface (model.GPT, rnn.RNN).

    for token in generate_stream(model, prompt_ids, 200, temperature=0.8, top_k=50): ...   # one (B,) tensor per step
    out = model.generate(prompt_ids, 200, temperature=0.8, top_k=50)   # (B, T + 200), as nanoGPT's generate

Sampling policy (temperature, top-k, top-p, stop tokens, left padding) and the context-overflow policy live here;
the models only compute logits, and keep a cache or state between calls.
"""
import torch

from attnlab.runtime import activation_dtype


def check_sampling(max_new_tokens, temperature, top_k, top_p):
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 is greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1, or unset to keep every token")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p} must be in (0, 1]; 1 keeps every token")


def sample_token(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """One token per row of logits (B, vocab): greedy at temperature 0, else from the top-k / nucleus."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # drop a token when the tokens before it already hold top_p of the mass (the first always stays)
        drop = probs.cumsum(dim=-1) - probs > top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    # torch.multinomial's own draw for one sample, argmax(p / q) with q ~ Exp(1) (the Gumbel-max trick), the same
    # tokens for the same generator; without its check that p is finite, which reads the tensor back every token
    probs = logits.softmax(dim=-1)
    return (probs / torch.empty_like(probs).exponential_(generator=generator)).argmax(dim=-1)


def needs_refill(cache, window):
    """Whether the next step reads its context whole rather than one token through the cache: always without a
    cache; with one, when it is empty (the prompt) or holds a full window (a model without one never fills)."""
    return cache is None or cache.length in (0, window)


def refill_start(end, window, cache):
    """Where the context read whole before token `end` starts: the last `window` tokens, or when a full cache is
    rebuilt, its last window // 2, which leaves room for window // 2 steps before the next rebuild."""
    if window is None:
        return 0
    keep = window
    if cache is not None and cache.length == window:
        keep = window // 2
    return max(0, end - keep)


def generate(model, idx, max_new_tokens, **kwargs):
    """The prompts idx (B, T) followed by max_new_tokens tokens, (B, T + max_new_tokens): generate_stream's tokens
    (the same keyword arguments) gathered, as nanoGPT's model.generate returns them."""
    new = list(generate_stream(model, idx, max_new_tokens, **kwargs))
    return torch.cat([idx] + [token[:, None] for token in new], dim=1)


@torch.inference_mode()  # no autograd bookkeeping at all: cheaper per operation than no_grad
def generate_stream(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, stop_tokens=None,
                    generator=None, attention_mask=None, kv_cache=True):
    """Yield the next token (B,) for max_new_tokens steps after the prompts idx (B, T), left-padded where
    attention_mask (B, T) is False. temperature=0 is greedy. A sequence that emitted one of stop_tokens repeats it
    until every sequence has stopped.

    Context overflow, for a model with a context_window W (a GPT's block_size): the cache holds W tokens; when it
    is full we keep the last W // 2 tokens and rebuild the cache from them with one forward pass, so each token
    costs O(W) and the context never exceeds what the model was trained on. Without the cache, every step
    recomputes the last W tokens (nanoGPT's way), which sees up to W - 1 earlier tokens instead. A model without a
    window (an RNN: context_window None) carries its state over the whole sequence, and without the cache re-reads
    the whole sequence from a zero state each step: the same tokens, at O(T) per token. In a left-padded batch the
    window slides at the pace of the longest row, so past W a padded row's tokens can differ from its tokens alone.
    A sliding-window GPT (model.window < W) changes only what the cache holds: its last `window` keys, so its memory
    stays constant; its positions still run out at W, so the refill above happens just the same."""
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    (B, T), window = idx.shape, model.context_window
    # the prompts and every new token in one buffer written in place, rather than a concatenation per token
    tokens = torch.cat([idx, idx.new_zeros(B, max_new_tokens)], dim=1)  # (B, T + max_new_tokens)
    mask = None
    if attention_mask is not None:
        mask = torch.cat([attention_mask.bool(), attention_mask.new_ones(B, max_new_tokens, dtype=torch.bool)], 1)
    done = torch.zeros(B, dtype=torch.bool, device=idx.device)
    stops = torch.tensor(sorted(stop_tokens or []), dtype=torch.long, device=idx.device)
    cache = None
    if kv_cache:
        cache = model.new_cache(B, idx.device, activation_dtype(model, idx.device))
    for end in range(T, T + max_new_tokens):  # tokens[:, :end] are known, tokens[:, end] is next
        if needs_refill(cache, window):  # read a context whole: the prompt, a full cache's refill, or no cache
            start = refill_start(end, window, cache)
            context_mask = None
            if mask is not None:
                context_mask = mask[:, start:end]
            if cache is not None:
                cache.clear()
            logits, _ = model(tokens[:, start:end], attention_mask=context_mask, cache=cache, last_logits_only=True)
        else:
            logits, _ = model(tokens[:, end - 1:end], cache=cache, last_logits_only=True)
        next_token = sample_token(logits[:, -1].float(), temperature, top_k, top_p, generator)  # (B,)
        if stops.numel():
            next_token = torch.where(done, tokens[:, end - 1], next_token)
            done |= torch.isin(next_token, stops)
        tokens[:, end] = next_token
        yield next_token
        if stops.numel() and done.all():
            return
