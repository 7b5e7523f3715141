"""Score a trained model on the whole of a text: loss (nats per token), perplexity and bits per byte.

    python -m scripts.evaluate out_dir=out/mini                       # the val split of the corpus the run trained on
    python -m scripts.evaluate out_dir=out/mini split=train checkpoint=latest
    python -m scripts.evaluate out_dir=out/mini text=notes.txt        # any UTF-8 file, in the run's tokenizer
    python -m scripts.evaluate out_dir=out/mini text=notes.txt json=true   # one JSON object on stdout, for scripts

Every token after the first is scored once, in consecutive windows of the model's block_size (attnlab/scoring.py), as in
training; an RNN starts each window from a zero state, as it was trained. Bits per byte divide the loss of the tokens
that cover text by the UTF-8 bytes they cover (attnlab/scoring.py), so char-level and BPE models compare. A char model
refuses a text holding characters outside its vocabulary, naming them, rather than guess at them.
"""
import json
import math
import sys
from pathlib import Path

import hydra
import numpy as np
from omegaconf import OmegaConf
from tqdm import tqdm

from attnlab.checkpoint import load_model
from attnlab.cli import one_line_errors, run_cli
from attnlab.config import CONFIG_DIR, DataConfig, EvalConfig, register_configs
from attnlab.runtime import autocast, autocast_dtype, pick_device
from attnlab.scoring import byte_counts, score_stream
from data.corpus import decode_utf8, load_meta, load_split, prepare
from data.tokenizers import load_tokenizer

register_configs()


def text_ids(path, tokenizer):
    """The token ids of a UTF-8 text file."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"text={path} does not exist; pass text=FILE, a UTF-8 text file")
    text = decode_utf8(Path(path).read_bytes(), f"text={path}")
    return np.array(tokenizer.encode(text, name=f"text={path}"), dtype=np.int64)


def split_ids(out_dir, split, meta, block_size):
    """A split of the corpus the run trained on, as its receipt (config.json) names it; prepared again if its
    folder is gone. Refused when the corpus changed since, as the split would hold other text."""
    receipt = Path(out_dir) / "config.json"
    if not receipt.is_file():
        raise FileNotFoundError(f"{receipt} is missing, so the run's corpus is unknown; pass text=FILE instead")
    data_cfg = DataConfig(**json.loads(receipt.read_text())["config"]["data"])
    folder = prepare(data_cfg, block_size)
    prepared = load_meta(folder)
    if (prepared.get("fingerprint"), prepared["tokenizer"]) != (meta.get("fingerprint"), meta["tokenizer"]):
        raise ValueError(f"corpus {data_cfg.name} ({prepared['source']}) changed since the run in {out_dir} trained on "
                         f"it; pass text=FILE to score a file instead")
    return load_split(folder, split)


def evaluate(cfg: EvalConfig, out=None) -> dict:
    """Score the whole text that cfg names; prints the result to `out` and returns it."""
    out = sys.stdout if out is None else out  # the stdout of the call, not of the import (a redirected one too)
    device = pick_device(cfg.device)
    amp = autocast(device, autocast_dtype(device, cfg.dtype))
    model, meta = load_model(cfg.out_dir, cfg.checkpoint, device)
    tokenizer = load_tokenizer(meta)
    block_size = model.config.block_size  # an RNN has no context limit, but trained on windows this long
    split = cfg.split or "val"
    if cfg.text:
        ids, source = text_ids(cfg.text, tokenizer), f"text={cfg.text}"
    else:
        ids, source = split_ids(cfg.out_dir, split, meta, block_size), f"split={split} of {meta['name']}"
    if len(ids) < 2:
        raise ValueError(f"{source} holds {len(ids)} token(s) but scoring needs 2 or more (the first is only "
                         f"context); pass a longer text")
    counts, tally = byte_counts(tokenizer, device), None
    with tqdm(total=len(ids) - 1, desc="scoring", unit="tok", unit_scale=True, dynamic_ncols=True,
              mininterval=1.0) as bar:
        for tally in score_stream(model, ids, cfg.batch_size, block_size, counts, amp):
            bar.update(tally.tokens - bar.n)
    loss, tokens, n_bytes = tally.loss, tally.tokens, tally.bytes
    result = {"out_dir": cfg.out_dir, "checkpoint": cfg.checkpoint, "source": source, "loss": loss,
              "perplexity": math.exp(loss), "bits_per_byte": tally.bits_per_byte, "tokens": tokens,
              "bytes": n_bytes, "block_size": block_size}
    if cfg.json:
        out.write(json.dumps(result) + "\n")
    else:
        out.write(f"{cfg.out_dir} (checkpoint={cfg.checkpoint}) on {source}: {tokens:,} tokens scored ({n_bytes:,} "
                  f"bytes) in windows of {block_size}\n"
                  f"  loss        {loss:.4f} nats/token\n"
                  f"  perplexity  {result['perplexity']:.3f}\n"
                  f"  bits/byte   {result['bits_per_byte']:.4f}\n")
    return result


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="evaluate")
@one_line_errors
def main(dict_cfg):
    evaluate(OmegaConf.to_object(dict_cfg))


if __name__ == "__main__":
    run_cli(main, help_script="-m scripts.evaluate")
