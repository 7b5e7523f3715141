"""data/tokenizers.py: characters, GPT-2's BPE and a BPE trained here round trip text, name what they cannot encode,
and rebuild from a meta.json spec; the trained BPE is deterministic and its ranks file is one tiktoken's own loader
reads. Offline (a tiny ranks file, a BPE trained on CORPUS; GPT-2's own where ../shared/data has it), seconds."""
import base64
import json

import pytest
import tiktoken
import tiktoken.load
from conftest import CORPUS, SHARED_DATA
from hypothesis import example, given, settings
from hypothesis import strategies as st

import data.tokenizers as tokenizers
from data.tokenizers import EOT, GPT2_EOT, BPETokenizer, CharTokenizer, GPT2Tokenizer, load_tokenizer

GPT2_FILE = SHARED_DATA / "gpt2.tiktoken"
BPE_VOCAB = 400  # 256 bytes, 143 merges and <|endoftext|>: CORPUS (ASCII code, 15 KB) has pairs enough for them


def corpus_lines():
    """CORPUS line by line, as a generator: train must stream its texts, never needing a list."""
    yield from CORPUS.splitlines(keepends=True)


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.train(corpus_lines(), BPE_VOCAB)


@given(st.text(min_size=1), st.data())
def test_char_round_trip(text, data):
    tok = CharTokenizer(sorted(set(text)))
    covered = data.draw(st.text(alphabet=tok.chars))
    assert tok.decode(tok.encode(covered)) == covered
    assert tok.encode(text) == [tok.chars.index(c) for c in text]


def test_char_unknown_characters_named():
    with pytest.raises(ValueError, match=r"vocabulary lacks: 'é', '€'; remove them or train on a corpus"):
        CharTokenizer("abc").encode("aé€bé")


def test_tiny_gpt2_applies_merges(tiny_bpe):
    tok = GPT2Tokenizer(tiny_bpe)
    assert tok.encode("hello world") == [256, 257, ord("o"), 258, *b"orld"]
    assert tok.vocab_size == 50257 and tok.eot_token == GPT2_EOT


@pytest.fixture(scope="module")
def tiny_gpt2(tiny_bpe):
    return GPT2Tokenizer(tiny_bpe)  # built once: parsing 50k ranks per example would outlast hypothesis's deadline


@settings(max_examples=50)
@given(st.text())
def test_tiny_gpt2_round_trip(tiny_gpt2, text):
    assert tiny_gpt2.decode(tiny_gpt2.encode(text)) == text


def test_end_of_text_in_a_corpus_is_plain_text(tiny_bpe):
    tok = GPT2Tokenizer(tiny_bpe)
    ids = tok.encode("a<|endoftext|>b")
    assert GPT2_EOT not in ids and tok.decode(ids) == "a<|endoftext|>b"


@pytest.mark.skipif(not GPT2_FILE.exists(), reason=f"needs {GPT2_FILE}")
def test_real_gpt2_file():
    tok = GPT2Tokenizer(GPT2_FILE)
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.vocab_size == 50257


@pytest.mark.parametrize("make", [lambda bpe: CharTokenizer("ab\n"), lambda bpe: GPT2Tokenizer(bpe)])
def test_a_spec_rebuilds_the_same_tokenizer(tiny_bpe, make):
    tok = make(tiny_bpe)
    rebuilt = load_tokenizer({"tokenizer": tok.spec()})
    assert rebuilt.vocab_size == tok.vocab_size and rebuilt.encode("ab\nba") == tok.encode("ab\nba")


def test_an_unknown_spec_is_named():
    with pytest.raises(ValueError, match="tokenizer 'sentencepiece' is unknown; use char, gpt2 or bpe"):
        load_tokenizer({"tokenizer": {"type": "sentencepiece"}})


def test_gpt2_offline_without_bpe_file_names_the_fix(monkeypatch):
    def get_encoding(name):
        raise ConnectionError("offline")

    monkeypatch.setattr(tokenizers.tiktoken, "get_encoding", get_encoding)
    with pytest.raises(ValueError, match=r"\(ConnectionError\); pass data.bpe_file=PATH to a gpt2.tiktoken file$"):
        GPT2Tokenizer()


@pytest.mark.parametrize("contents, error, message", [
    (None, FileNotFoundError, r"data.bpe_file=.*gpt2.tiktoken does not exist; pass the path to a gpt2.tiktoken"),
    ("x y", ValueError, r"data.bpe_file=.*gpt2.tiktoken is not a .tiktoken ranks file \(.*\); pass a gpt2.tiktoken"),
])
def test_a_bad_bpe_file_is_named(tmp_path, contents, error, message):
    path = tmp_path / "gpt2.tiktoken"
    if contents is not None:  # None: no file at all
        path.write_text(contents)
    with pytest.raises(error, match=message) as info:
        GPT2Tokenizer(path)
    assert "\n" not in str(info.value)


def test_bpe_vocabulary_ends_with_end_of_text(bpe):
    assert bpe.vocab_size == BPE_VOCAB and bpe.eot_token == BPE_VOCAB - 1
    assert bpe.enc.decode_single_token_bytes(bpe.eot_token) == EOT.encode()
    ids = bpe.encode("a<|endoftext|>b")  # plain text, as on GPT-2's path
    assert bpe.eot_token not in ids and bpe.decode(ids) == "a<|endoftext|>b"


@settings(max_examples=200)
@given(st.text())
@example("naïve café, 漢字 and 🦀\r\n\t")  # characters that CORPUS (ASCII) never shows
def test_bpe_round_trip(bpe, text):
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text and bpe.token_bytes(ids).sum() == len(text.encode())


def test_bpe_compresses_its_corpus(bpe):
    ids = bpe.encode(CORPUS)
    assert len(ids) < len(CORPUS.encode()) and max(ids) < bpe.eot_token
    assert bpe.token_bytes(ids).sum() == len(CORPUS.encode())


def test_bpe_training_is_deterministic(bpe):
    again = BPETokenizer.train(corpus_lines(), BPE_VOCAB)
    assert again.ranks_text == bpe.ranks_text and again.pattern == bpe.pattern


def test_bpe_training_streams_a_generator():
    read = []

    def lines():
        for line in corpus_lines():
            read.append(line)
            yield line

    tok = BPETokenizer.train(lines(), BPE_VOCAB)
    assert "".join(read) == CORPUS and tok.vocab_size == BPE_VOCAB


def test_bpe_ranks_are_a_file_tiktoken_loads(bpe, tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken's loader would otherwise keep a copy in its cache
    (tmp_path / "bpe.tiktoken").write_text(bpe.ranks_text)
    ranks = tiktoken.load.load_tiktoken_bpe(str(tmp_path / "bpe.tiktoken"))
    assert ranks == {bpe.enc.decode_single_token_bytes(i): i for i in range(bpe.eot_token)}
    enc = tiktoken.Encoding("loaded", pat_str=bpe.pattern, mergeable_ranks=ranks, special_tokens={EOT: bpe.eot_token})
    for text in (CORPUS, "naïve café, 漢字 and 🦀 <|endoftext|>"):
        assert enc.encode_ordinary(text) == bpe.encode(text)


def test_bpe_spec_rebuilds_it_through_json(bpe):
    spec = json.loads(json.dumps(bpe.spec()))  # meta.json; checkpoints need plain str and int too
    assert spec["type"] == "bpe" and spec["vocab_size"] == BPE_VOCAB
    assert all(isinstance(value, (str, int)) for value in spec.values())
    rebuilt = load_tokenizer({"tokenizer": spec})
    assert rebuilt.vocab_size == BPE_VOCAB and rebuilt.eot_token == bpe.eot_token
    assert rebuilt.encode(CORPUS) == bpe.encode(CORPUS)


@pytest.mark.parametrize("vocab_size, message", [
    (257, r"^data.bpe_vocab_size=257 is too small; use at least 258 \(256 bytes, a merge and <\|endoftext\|>\)$"),
    (300, r"^data.bpe_vocab_size=300 is more than the corpus can fill: it has only 2 merges to learn; use at most "
          r"259$"),
])
def test_bpe_impossible_vocab_size_is_one_line(vocab_size, message):
    with pytest.raises(ValueError, match=message):
        BPETokenizer.train(iter(["abc"]), vocab_size)  # two merges: (a, b), then (ab, c)


def test_end_of_text_covers_no_bytes(tiny_bpe, bpe):
    for tok in (GPT2Tokenizer(tiny_bpe), bpe):
        assert tok.token_bytes([tok.eot_token, ord("a")]).tolist() == [0, 1]


def test_an_id_that_no_token_has_covers_no_bytes(tmp_path):
    ranks = tmp_path / "gaps.tiktoken"  # single bytes only: ids 256 to 50255 are no token, 50256 is <|endoftext|>
    ranks.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    assert GPT2Tokenizer(ranks).token_bytes([97, 256, 50255, GPT2_EOT]).tolist() == [1, 0, 0, 0]
