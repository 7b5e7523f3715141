"""Prepare a corpus ahead of training (train.py prepares it itself when needed); the same options as train.py.

    python -m data.prepare data=shakespeare_char
    python -m data.prepare data=text data.path=notes/
    python -m data.prepare data=text data.path=/data/fineweb/ data.tokenizer=bpe data.bpe_vocab_size=16384
"""
import sys

from attnlab.cli import one_line_errors, run_cli
from attnlab.config import compose
from data.corpus import load_meta, prepare


@one_line_errors
def main():
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(f"{__doc__.strip()}\n\nIt takes train.py's keys: python train.py --help lists them, with the presets.")
        return
    cfg = compose(*sys.argv[1:])
    folder = prepare(cfg.data, cfg.model.block_size)
    meta = load_meta(folder)
    print(f"{folder}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} validation tokens, "
          f"vocab_size={meta['vocab_size']}, {meta['documents']:,} documents, {meta['bytes_per_token']} bytes/token")


if __name__ == "__main__":
    run_cli(main, help_script="train.py")  # the same config as train.py's
