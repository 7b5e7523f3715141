"""Sample text from a trained model; the checkpoint alone rebuilds the model and its tokenizer.

    python sample.py                                   # continue "\\n" from the default run in out/
    python sample.py out_dir=out/mini prompt="ROMEO:" num_samples=3 max_new_tokens=300 top_k=50 top_p=0.95
    python sample.py out_dir=out/mini 'prompts=[ROMEO:,JULIET:]'   # several prompts in one padded batch
    python sample.py out_dir=out/mini prompt_file=prompt.txt kv_cache=false
    python sample.py init_from=gpt2 prompt="Hello, I'm a language model,"  # published GPT-2 (transformers)
"""
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import OmegaConf

from attnlab.checkpoint import load_model
from attnlab.cli import one_line_errors, quote_free_text, run_cli
from attnlab.config import CONFIG_DIR, SampleConfig, register_configs
from attnlab.decode import generate_stream
from attnlab.hf import from_hf
from attnlab.runtime import autocast, autocast_dtype, pick_device, skip_exit_collections
from data.tokenizers import GPT2Tokenizer, load_tokenizer

register_configs()


def encode_prompts(prompts, tokenizer, context_window, device):
    """Token ids (B, T), left-padded, and the mask of real tokens (or None when all have one length). A prompt may
    fill the model's context window (None: no limit)."""
    encoded = [tokenizer.encode(p, name="the prompt") for p in prompts]
    for p, ids in zip(prompts, encoded):
        if not ids:
            raise ValueError("the prompt is empty; pass prompt=TEXT (a newline is a good neutral start)")
        if context_window is not None and len(ids) > context_window:
            raise ValueError(f"prompt {p[:20]!r}... is {len(ids)} tokens, longer than the model's block_size="
                             f"{context_window}; shorten it")
    width = max(len(ids) for ids in encoded)
    idx = torch.tensor([[0] * (width - len(ids)) + ids for ids in encoded], device=device)
    mask = torch.tensor([[False] * (width - len(ids)) + [True] * len(ids) for ids in encoded], device=device)
    return idx, None if mask.all() else mask


def sample(cfg: SampleConfig, out=None):
    """Generate as cfg says; streams a single sample to `out`, prints a batch once all finish. Returns texts."""
    out = sys.stdout if out is None else out  # the stdout of the call, not of the import (a redirected one too)
    device = pick_device(cfg.device)
    dtype = autocast_dtype(device, cfg.dtype)
    if cfg.init_from:
        model, tokenizer = from_hf(cfg.init_from).to(device), GPT2Tokenizer(cfg.bpe_file, option="bpe_file")
    else:
        model, meta = load_model(cfg.out_dir, cfg.checkpoint, device)
        tokenizer = load_tokenizer(meta)
    if cfg.prompt_file:
        if not Path(cfg.prompt_file).is_file():
            raise FileNotFoundError(f"prompt_file={cfg.prompt_file} does not exist; pass an existing text file")
        prompts = [Path(cfg.prompt_file).read_text(encoding="utf-8")]
    else:
        prompts = cfg.prompts or [cfg.prompt]
    prompts = [p for p in prompts for _ in range(cfg.num_samples)]
    idx, mask = encode_prompts(prompts, tokenizer, model.context_window, device)
    torch.manual_seed(cfg.seed)
    generator = torch.Generator(device).manual_seed(cfg.seed)
    stop = getattr(tokenizer, "eot_token", None)
    stream = generate_stream(model, idx, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k,
                             top_p=cfg.top_p, stop_tokens=[stop] if stop is not None else None,
                             generator=generator, attention_mask=mask, kv_cache=cfg.kv_cache)
    new_tokens, shown = [], 0
    if len(prompts) == 1:
        out.write(prompts[0])
    with autocast(device, dtype):
        for token in stream:
            new_tokens.append(token.tolist())
            if len(prompts) == 1:  # stream; hold back a partly decoded multi-byte character
                text = tokenizer.decode([t[0] for t in new_tokens if t[0] != stop])
                if not text.endswith("\ufffd"):
                    out.write(text[shown:])
                    out.flush()
                    shown = len(text)
    texts = []
    for i, prompt in enumerate(prompts):
        ids = [step[i] for step in new_tokens]
        ids = ids[:ids.index(stop)] if stop in ids else ids
        texts.append(prompt + tokenizer.decode(ids))
    if len(prompts) == 1:
        out.write(texts[0][len(prompts[0]) + shown:] + "\n")
    else:
        out.write("\n---------------\n".join(texts) + "\n")
    return texts


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="sample")
@one_line_errors
def main(dict_cfg):
    sample(OmegaConf.to_object(dict_cfg))


if __name__ == "__main__":
    quote_free_text(sys.argv, "prompt")
    run_cli(main)
    skip_exit_collections()
