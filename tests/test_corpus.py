"""Tests for data/prepare.py: tokenizers, preparing and reusing corpora, and the one-line errors. Offline, seconds."""
import base64
import io
import platform
import sys
import urllib.error
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import data.prepare as prep
from config import DataConfig
from data.prepare import CharTokenizer, GPT2Tokenizer, load_meta, load_split, load_tokenizer, prepare

REPO = Path(__file__).resolve().parents[1]
GPT2_FILE = REPO.parent / "shared/data/gpt2.tiktoken"
URL = "https://example.com/input.txt"


@pytest.fixture(scope="module")
def tiny_bpe(tmp_path_factory):
    """A .tiktoken file with every single byte plus three merges, so BPE round trips any text."""
    ranks = [bytes([b]) for b in range(256)] + [b"he", b"ll", b" w"]
    path = tmp_path_factory.mktemp("bpe") / "tiny.tiktoken"
    path.write_text("".join(f"{base64.b64encode(token).decode()} {rank}\n" for rank, token in enumerate(ranks)))
    return path


def text_cfg(tmp_path, path, **kwargs):
    return DataConfig(name="text", path=str(path), dir=str(tmp_path / "prepared"), **kwargs)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def corpus_text(n=1000):
    return "".join("abcdefgh\n "[(i * 7 + i // 13) % 10] for i in range(n))


def decoded(folder, split):
    return load_tokenizer(load_meta(folder)).decode(load_split(folder, split))


# ---- tokenizers ----

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
    assert tok.vocab_size == 50257 and tok.eot_token == 50256


@settings(max_examples=50)
@given(st.text())
def test_tiny_gpt2_round_trip(tiny_bpe, text):
    tok = GPT2Tokenizer(tiny_bpe)
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=200)
@given(st.text(alphabet="ab \n\t\r'1é.", max_size=60), st.integers(1, 8))
def test_pieces_tokenize_as_the_whole(tiny_bpe, text, size):
    tok = GPT2Tokenizer(tiny_bpe)
    pieces = list(prep._pieces(text, size))
    assert "".join(pieces) == text
    assert [t for p in pieces for t in tok.encode(p)] == tok.encode(text)


@pytest.mark.skipif(not GPT2_FILE.exists(), reason=f"needs {GPT2_FILE}")
def test_real_gpt2_file():
    tok = GPT2Tokenizer(GPT2_FILE)
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.vocab_size == 50257


def test_tokenizer_rebuilds_from_meta_alone(tmp_path, tiny_bpe):
    for tokenizer in ("char", "gpt2"):
        cfg = text_cfg(tmp_path, write(tmp_path / "a.txt", "hello world\n" * 50), tokenizer=tokenizer,
                       bpe_file=str(tiny_bpe))
        folder = prepare(cfg, block_size=8)
        assert decoded(folder, "train") + decoded(folder, "val") == "hello world\n" * 50
        assert load_split(folder, "train").dtype == np.uint16


# ---- preparing corpora ----

def test_prepare_text_file(tmp_path):
    text = corpus_text()
    folder = prepare(text_cfg(tmp_path, write(tmp_path / "a.txt", text)), block_size=16)
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "train.bin", "val.bin"]  # no temporary files
    meta = load_meta(folder)
    assert (meta["train_tokens"], meta["val_tokens"], meta["vocab_size"]) == (900, 100, len(set(text)))
    assert decoded(folder, "val") == text[-100:] and decoded(folder, "train") == text[:-100]
    assert meta["tokenizer"] == {"type": "char", "chars": sorted(set(text))}


def test_prepare_reuses_until_source_changes(tmp_path, monkeypatch):
    path = write(tmp_path / "a.txt", corpus_text())
    cfg = text_cfg(tmp_path, path)
    folder = prepare(cfg, block_size=16)
    mtime = (folder / "train.bin").stat().st_mtime_ns
    with monkeypatch.context() as m:
        m.setattr(prep, "_tokenize", lambda *args: pytest.fail("re-tokenized an unchanged corpus"))
        assert prepare(cfg, block_size=16) == folder
    assert (folder / "train.bin").stat().st_mtime_ns == mtime

    write(path, corpus_text(2000))
    assert prepare(cfg, block_size=16) == folder
    assert load_meta(folder)["train_tokens"] == 1800
    prepare(text_cfg(tmp_path, path, val_fraction=0.5), block_size=16)
    assert load_meta(folder)["val_tokens"] == 1000


def test_interrupted_prepare_is_not_reused(tmp_path, monkeypatch):
    path = write(tmp_path / "a.txt", corpus_text())
    cfg = text_cfg(tmp_path, path)
    folder = prepare(cfg, block_size=16)
    write(path, corpus_text(2000))
    with monkeypatch.context() as m:
        m.setattr(prep, "_tokenize", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            prepare(cfg, block_size=16)
    assert not (folder / "meta.json").exists()
    prepare(cfg, block_size=16)
    assert load_meta(folder)["train_tokens"] == 1800


def test_different_sources_get_different_folders(tmp_path, tiny_bpe):
    a = prepare(text_cfg(tmp_path, write(tmp_path / "x/a.txt", corpus_text())), block_size=16)
    b = prepare(text_cfg(tmp_path, write(tmp_path / "y/a.txt", corpus_text())), block_size=16)
    c = prepare(text_cfg(tmp_path, tmp_path / "y/a.txt", tokenizer="gpt2", bpe_file=str(tiny_bpe)), block_size=16)
    assert len({a, b, c}) == 3 and a.parent == b.parent == c.parent
    assert a.name.startswith("text-char-") and c.name.startswith("text-gpt2-")


def test_prepare_folder_of_files(tmp_path):
    write(tmp_path / "docs/b.md", "# bee\n" * 20)
    write(tmp_path / "docs/a.txt", "ant\n" * 20)
    write(tmp_path / "docs/sub/c.txt", "cat\n" * 20)
    write(tmp_path / "docs/skip.py", "print('not text')\n")
    folder = prepare(text_cfg(tmp_path, tmp_path / "docs", val_fraction=0.25), block_size=8)
    text = decoded(folder, "train") + decoded(folder, "val")
    assert text == "\n\n".join(["ant\n" * 20, "# bee\n" * 20, "cat\n" * 20])  # sorted by path, recursively
    assert load_meta(folder)["files"] == 3


def test_large_vocabulary_uses_uint32(tmp_path):
    text = "".join(chr(c) for c in range(0x100, 0x100 + 70_000) if not 0xD800 <= c < 0xE000)
    folder = prepare(text_cfg(tmp_path, write(tmp_path / "wide.txt", text)), block_size=8)
    assert load_split(folder, "train").dtype == np.uint32
    assert decoded(folder, "val") == text[len(text) - len(text) // 10:]


@pytest.fixture(scope="module")
def stdlib_folder(tmp_path_factory):
    return prepare(DataConfig(dir=str(tmp_path_factory.mktemp("prepared"))), block_size=256)


def test_stdlib_corpus(stdlib_folder):
    meta = load_meta(stdlib_folder)
    assert meta["name"] == "stdlib" and meta["python_version"] == platform.python_version()
    assert meta["files"] > 50 and 3_000_000 < meta["train_tokens"] + meta["val_tokens"] < 4_000_000
    assert meta["vocab_size"] < 128
    train = decoded(stdlib_folder, "train")
    assert "\ndef " in train and "\nimport " in train and "self." in train


def test_download_is_cached_and_reused(tmp_path, monkeypatch):
    calls = []

    def urlopen(url, timeout):
        calls.append(url)
        return io.BytesIO(b"To be, or not to be: that is the question.\n" * 10)

    monkeypatch.setattr(prep.urllib.request, "urlopen", urlopen)
    cfg = DataConfig(name="shakespeare_char", url=URL, dir=str(tmp_path))
    folder = prepare(cfg, block_size=8)
    assert calls == [URL] and (folder / "input.txt").read_bytes().startswith(b"To be")
    prepare(DataConfig(name="shakespeare_char", url=URL, dir=str(tmp_path), val_fraction=0.5), block_size=8)
    assert calls == [URL] and load_meta(folder)["val_tokens"] == 215


def test_download_failure_names_data_path(tmp_path, monkeypatch):
    def urlopen(url, timeout):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(prep.urllib.request, "urlopen", urlopen)
    with pytest.raises(ValueError, match=r"^could not download .* \(no network\); .* pass data.path=FILE$"):
        prepare(DataConfig(name="shakespeare_char", url=URL, dir=str(tmp_path)), block_size=8)


# ---- user mistakes: one line each, naming the fix ----

def bad_bytes(tmp_path):
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 au lait")
    return text_cfg(tmp_path, tmp_path / "latin1.txt")


def empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    return text_cfg(tmp_path, tmp_path / "empty")


@pytest.mark.parametrize("make_cfg, error, match", [
    (lambda p: DataConfig(name="wiki", dir=str(p)), ValueError, "data.name='wiki' is unknown; use one of stdlib, "),
    (lambda p: DataConfig(tokenizer="bpe", dir=str(p)), ValueError, "unknown; use one of char, gpt2"),
    (lambda p: DataConfig(val_fraction=1.0, dir=str(p)), ValueError, "val_fraction=1.0 must be between 0 and 1"),
    (lambda p: DataConfig(name="text", dir=str(p)), ValueError, "data=text needs a text: pass data.path=FILE"),
    (lambda p: DataConfig(path="notes.txt", dir=str(p)), ValueError, "add data=text"),
    (lambda p: text_cfg(p, p / "missing.txt"), FileNotFoundError, "missing.txt does not exist; pass data.path="),
    (lambda p: text_cfg(p, write(p / "empty.txt", "")), ValueError, "holds no text"),
    (empty_folder, ValueError, "holds no .txt or .md files"),
    (bad_bytes, ValueError, r"latin1.txt is not UTF-8 \(byte 3 is b'\\xe9'\); convert it"),
    (lambda p: text_cfg(p, write(p / "a.txt", "x" * 100)), ValueError,
     "corpus text has only 10 validation tokens but block_size=64 needs 65; use a longer text or a smaller model"),
    (lambda p: text_cfg(p, write(p / "a.txt", "x"), tokenizer="gpt2", bpe_file=str(p / "no.tiktoken")),
     FileNotFoundError, "data.bpe_file=.*no.tiktoken does not exist"),
    (lambda p: text_cfg(p, write(p / "a.txt", "x"), tokenizer="gpt2", bpe_file=str(write(p / "b.tiktoken", "x y"))),
     ValueError, "is not a .tiktoken ranks file"),
])
def test_user_mistakes_give_one_line(tmp_path, make_cfg, error, match):
    with pytest.raises(error, match=match) as info:
        prepare(make_cfg(tmp_path), block_size=64)
    assert "\n" not in str(info.value)


def test_gpt2_offline_without_bpe_file(tmp_path, monkeypatch):
    def get_encoding(name):
        raise ConnectionError("offline")

    monkeypatch.setattr(prep.tiktoken, "get_encoding", get_encoding)
    with pytest.raises(ValueError, match=r"pass data.bpe_file=PATH to a gpt2.tiktoken file$"):
        prepare(text_cfg(tmp_path, write(tmp_path / "a.txt", "x" * 100), tokenizer="gpt2"), block_size=8)


# ---- the prepare command and its presets ----

@pytest.mark.skipif(not (REPO / "configs/config.yaml").exists(), reason="needs configs/config.yaml")
def test_prepare_command(tmp_path, monkeypatch, capsys):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import config

    config.register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        for preset in sorted((REPO / "configs/data").glob("*.yaml")):
            data = OmegaConf.to_object(compose(config_name="config", overrides=[f"data={preset.stem}"])).data
            assert data.name == preset.stem
    path = write(tmp_path / "a.txt", corpus_text())
    monkeypatch.setattr(sys, "argv", ["prepare", "data=text", f"data.path={path}", f"data.dir={tmp_path}",
                                      "model.block_size=16"])
    prep.main()
    assert "900 train and 100 validation tokens, vocab_size=10" in capsys.readouterr().out
