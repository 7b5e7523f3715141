"""Corpora and tokenizers: `data/prepare.py` tokenizes a corpus into train.bin, val.bin and meta.json."""
