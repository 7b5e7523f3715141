"""Tokenizers: characters (the vocabulary of the corpus) and GPT-2's byte-level BPE (through tiktoken).

A prepared corpus names its tokenizer in meta.json (`spec()`); `load_tokenizer(meta)` rebuilds it for sampling and
evaluation; `token_bytes(ids)` gives each token's length in UTF-8 bytes, for bits per byte.
"""
import base64
from pathlib import Path

import numpy as np
import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's pre-tokenizer regex, as get_encoding("gpt2") uses

GPT2_EOT = 50256  # <|endoftext|>, the last id of the GPT-2 BPE
MISSING_LISTED = 20  # characters named in the error for a text outside a char vocabulary (a file may hold many)


class CharTokenizer:
    """One token per character; the vocabulary is the sorted set of characters in the corpus."""

    def __init__(self, chars):
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

    def encode(self, text, name="the text"):
        """Token ids of text; a character outside the vocabulary is an error naming `name` (the prompt, a file)."""
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            missing = sorted(set(text) - self.stoi.keys())
            listed = ", ".join(repr(c) for c in missing[:MISSING_LISTED])
            more = f" and {len(missing) - MISSING_LISTED} more" if len(missing) > MISSING_LISTED else ""
            raise ValueError(f"{name} has characters the model's vocabulary lacks: {listed}{more}; remove them or "
                             f"train on a corpus that has them") from None

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)

    def token_bytes(self, ids):
        """The UTF-8 length of each token of ids (an array): what bits per byte divide by."""
        return np.array([len(c.encode("utf-8")) for c in self.chars], dtype=np.int64)[np.asarray(ids)]

    def spec(self):
        return {"type": "char", "chars": self.chars}


class GPT2Tokenizer:
    """GPT-2's byte-level BPE through tiktoken, from a local ranks file or tiktoken's own download."""

    def __init__(self, bpe_file=None):
        self.bpe_file = str(Path(bpe_file).resolve()) if bpe_file else None
        if self.bpe_file:
            if not Path(self.bpe_file).is_file():
                raise FileNotFoundError(f"data.bpe_file={bpe_file} does not exist; pass the path to a gpt2.tiktoken "
                                        f"ranks file")
            self.enc = tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=_load_ranks(self.bpe_file),
                                         special_tokens={"<|endoftext|>": GPT2_EOT})
        else:
            try:
                self.enc = tiktoken.get_encoding("gpt2")
            except Exception as e:  # offline, tiktoken fails inside requests with errors of its own
                raise ValueError(f"could not load the gpt2 tokenizer ({type(e).__name__}); pass data.bpe_file=PATH to "
                                 f"a gpt2.tiktoken file") from None
        self.vocab_size = self.enc.n_vocab
        self.eot_token = self.enc.eot_token  # sample.py stops a sample here

    def encode(self, text, name="the text"):
        """Token ids of text; name is CharTokenizer.encode's, unused: byte-level BPE encodes any text."""
        return self.enc.encode_ordinary(text)  # "<|endoftext|>" in a text is plain text, not the special token

    def decode(self, ids):
        return self.enc.decode([int(i) for i in ids])

    def token_bytes(self, ids):
        """The byte length of each token of ids (an array); a token may hold part of a UTF-8 character."""
        distinct, where = np.unique(np.asarray(ids), return_inverse=True)
        lengths = np.array([len(self.enc.decode_single_token_bytes(int(i))) for i in distinct], dtype=np.int64)
        return lengths[where]

    def spec(self):
        return {"type": "gpt2", "bpe_file": self.bpe_file}


def _load_ranks(path):
    """A .tiktoken file: one base64-encoded token and its merge rank per line."""
    # Not tiktoken.load.load_tiktoken_bpe: it copies a local file into a cache keyed by the path alone and keeps
    # returning that copy after the file changes.
    try:
        return {base64.b64decode(token): int(rank)
                for token, rank in (line.split() for line in Path(path).read_bytes().splitlines() if line)}
    except ValueError as e:
        raise ValueError(f"data.bpe_file={path} is not a .tiktoken ranks file ({e}); pass a gpt2.tiktoken "
                         f"file") from None


def load_tokenizer(meta: dict):
    spec = meta["tokenizer"]
    if spec["type"] == "char":
        return CharTokenizer(spec["chars"])
    if spec["type"] == "gpt2":
        return GPT2Tokenizer(spec["bpe_file"])
    raise ValueError(f"tokenizer {spec['type']!r} is unknown; use char or gpt2")
