"""Corpora and tokenizers: `data/corpus.py` tokenizes a corpus into train.bin, val.bin and meta.json
(`python -m data.prepare` does it ahead of training); `data/tokenizers.py` holds the tokenizers."""
