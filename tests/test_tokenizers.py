"""data/tokenizers.py: characters and GPT-2's BPE round trip text, name what they cannot encode, and rebuild from a
meta.json spec. Offline (a tiny ranks file; GPT-2's own where ../shared/data has it), seconds."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import data.tokenizers as tokenizers
from conftest import SHARED_DATA
from data.tokenizers import GPT2_EOT, CharTokenizer, GPT2Tokenizer, load_tokenizer

GPT2_FILE = SHARED_DATA / "gpt2.tiktoken"


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


@settings(max_examples=50)
@given(st.text())
def test_tiny_gpt2_round_trip(tiny_bpe, text):
    tok = GPT2Tokenizer(tiny_bpe)
    assert tok.decode(tok.encode(text)) == text


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
    with pytest.raises(ValueError, match="tokenizer 'sentencepiece' is unknown; use char or gpt2"):
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
