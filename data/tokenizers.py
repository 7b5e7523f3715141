"""Tokenizers: characters (the vocabulary of the corpus), GPT-2's byte-level BPE, and a byte-level BPE trained on the
corpus with rustbpe (nanochat's trainer); both BPEs encode through tiktoken, and their last id is <|endoftext|>.

A prepared corpus names its tokenizer in meta.json (`spec()`); `load_tokenizer(meta)` rebuilds it for sampling and
evaluation; `token_bytes(ids)` gives each token's length in UTF-8 bytes, for bits per byte (0 for <|endoftext|>,
which stands for no text).
"""
import base64
from pathlib import Path

import numpy as np
import rustbpe
import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's pre-tokenizer regex, as get_encoding("gpt2") uses

EOT = "<|endoftext|>"  # the special token a document may end with
GPT2_EOT = 50256  # <|endoftext|>, the last id of the GPT-2 BPE
MIN_BPE_VOCAB = 258  # 256 bytes, at least one merge, and <|endoftext|>
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


class TiktokenTokenizer:
    """What the byte-level BPEs share: a tiktoken Encoding whose one special token is <|endoftext|>."""

    def __init__(self, enc):
        self.enc = enc
        self.vocab_size = enc.n_vocab
        self.eot_token = enc.eot_token  # sample.py stops a sample here

    def encode(self, text, name="the text"):
        """Token ids of text; name is CharTokenizer.encode's, unused: byte-level BPE encodes any text."""
        return self.enc.encode_ordinary(text)  # "<|endoftext|>" in a text is plain text, not the special token

    def decode(self, ids):
        return self.enc.decode([int(i) for i in ids])

    def token_bytes(self, ids):
        """The byte length of each token of ids (an array); a token may hold part of a UTF-8 character.
        <|endoftext|> covers none of the text, nor does an id that no token has (a ranks file with gaps)."""
        distinct, where = np.unique(np.asarray(ids), return_inverse=True)
        return np.array([self._byte_length(int(i)) for i in distinct], dtype=np.int64)[where]

    def _byte_length(self, token):
        if self.enc.is_special_token(token):
            return 0
        try:
            return len(self.enc.decode_single_token_bytes(token))
        except KeyError:
            return 0


class GPT2Tokenizer(TiktokenTokenizer):
    """GPT-2's byte-level BPE through tiktoken, from a local ranks file or tiktoken's own download."""

    def __init__(self, bpe_file=None, option="data.bpe_file"):
        """option: the key that sets bpe_file on the command line at hand, for the messages."""
        self.bpe_file = str(Path(bpe_file).resolve()) if bpe_file else None
        if self.bpe_file:
            if not Path(self.bpe_file).is_file():
                raise FileNotFoundError(f"{option}={bpe_file} does not exist; pass the path to a gpt2.tiktoken "
                                        f"ranks file")
            # Not tiktoken.load.load_tiktoken_bpe: it copies a local file into a cache keyed by the path alone and
            # keeps returning that copy after the file changes.
            try:
                ranks = _parse_ranks(Path(self.bpe_file).read_bytes())
            except ValueError as e:
                raise ValueError(f"{option}={self.bpe_file} is not a .tiktoken ranks file ({e}); pass a "
                                 f"gpt2.tiktoken file") from None
            enc = tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={EOT: GPT2_EOT})
        else:
            try:
                enc = tiktoken.get_encoding("gpt2")
            except Exception as e:  # offline, tiktoken fails inside requests with errors of its own
                raise ValueError(f"could not load the gpt2 tokenizer ({type(e).__name__}); pass {option}=PATH to "
                                 f"a gpt2.tiktoken file") from None
        super().__init__(enc)

    def spec(self):
        return {"type": "gpt2", "bpe_file": self.bpe_file}


class BPETokenizer(TiktokenTokenizer):
    """A byte-level BPE trained on the corpus: ids 0-255 are the bytes, then the merges in the order rustbpe learned
    them, then <|endoftext|>. Rebuilt from the text of its .tiktoken ranks file and its pre-tokenizer regex."""

    def __init__(self, ranks_text, pattern):
        self.ranks_text, self.pattern = ranks_text, pattern
        ranks = _parse_ranks(ranks_text)
        super().__init__(tiktoken.Encoding("bpe", pat_str=pattern, mergeable_ranks=ranks,
                                           special_tokens={EOT: max(ranks.values()) + 1}))

    @classmethod
    def train(cls, texts, vocab_size):
        """Learn vocab_size - 1 byte-level tokens from texts (an iterable of str, streamed: rustbpe reads it in
        buffers), plus <|endoftext|> as id vocab_size - 1."""
        if vocab_size < MIN_BPE_VOCAB:
            raise ValueError(f"data.bpe_vocab_size={vocab_size} is too small; use at least {MIN_BPE_VOCAB} (256 bytes, "
                             f"a merge and {EOT})")
        trainer = rustbpe.Tokenizer()
        trainer.train_from_iterator(texts, vocab_size - 1)  # rustbpe's default pattern: GPT-4's pre-tokenizer
        if trainer.vocab_size < vocab_size - 1:  # rustbpe stops when no two adjacent tokens are left to merge
            raise ValueError(f"data.bpe_vocab_size={vocab_size} is more than the corpus can fill: it has only "
                             f"{trainer.vocab_size - 256} merges to learn; use at most {trainer.vocab_size + 1}")
        ranks_text = "".join(f"{base64.b64encode(token).decode()} {rank}\n"
                             for token, rank in trainer.get_mergeable_ranks())
        return cls(ranks_text, trainer.get_pattern())

    def spec(self):
        return {"type": "bpe", "pattern": self.pattern, "ranks": self.ranks_text, "vocab_size": self.vocab_size}


def _parse_ranks(contents):
    """The ranks of a .tiktoken file's contents (str or bytes): one base64-encoded token and its rank per line."""
    return {base64.b64decode(token): int(rank)
            for token, rank in (line.split() for line in contents.splitlines() if line)}


def load_tokenizer(meta: dict):
    spec = meta["tokenizer"]
    if spec["type"] == "char":
        return CharTokenizer(spec["chars"])
    if spec["type"] == "gpt2":
        return GPT2Tokenizer(spec["bpe_file"])
    if spec["type"] == "bpe":
        return BPETokenizer(spec["ranks"], spec["pattern"])
    raise ValueError(f"tokenizer {spec['type']!r} is unknown; use char, gpt2 or bpe")
