"""data/corpus.py: preparing and reusing corpora, and the one-line errors (data/tokenizers.py has its own
tests/test_tokenizers.py). Offline, seconds."""
import io
import multiprocessing
import platform
import sys
import urllib.error

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import data.corpus as corpus
from config import DataConfig
from conftest import REPO, compose
from data.corpus import load_meta, load_split, prepare
from data.prepare import main as prepare_main
from data.tokenizers import GPT2Tokenizer, load_tokenizer

URL = "https://example.com/input.txt"


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


# ---- tokenizing in pieces, and the tokenizer's record ----

@settings(max_examples=200)
@given(st.text(alphabet="ab \n\t\r'1é.", max_size=60), st.integers(1, 8))
def test_pieces_tokenize_as_the_whole(tiny_bpe, text, size):
    tok = GPT2Tokenizer(tiny_bpe)
    pieces = list(corpus._pieces(text, size))
    assert "".join(pieces) == text
    assert [t for p in pieces for t in tok.encode(p)] == tok.encode(text)


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
        m.setattr(corpus, "_tokenize", lambda *args: pytest.fail("re-tokenized an unchanged corpus"))
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
        m.setattr(corpus, "_tokenize", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
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

    monkeypatch.setattr(corpus.urllib.request, "urlopen", urlopen)
    cfg = DataConfig(name="shakespeare_char", url=URL, dir=str(tmp_path))
    folder = prepare(cfg, block_size=8)
    assert calls == [URL] and (folder / "input.txt").read_bytes().startswith(b"To be")
    prepare(DataConfig(name="shakespeare_char", url=URL, dir=str(tmp_path), val_fraction=0.5), block_size=8)
    assert calls == [URL] and load_meta(folder)["val_tokens"] == 215


def test_download_failure_names_data_path(tmp_path, monkeypatch):
    def urlopen(url, timeout):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(corpus.urllib.request, "urlopen", urlopen)
    with pytest.raises(ValueError, match=r"^could not download .* \(no network\); .* pass data.path=FILE$"):
        prepare(DataConfig(name="shakespeare_char", url=URL, dir=str(tmp_path)), block_size=8)


# ---- user mistakes: one line each, naming the fix ----

def bad_bytes(tmp_path):
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 au lait")
    return text_cfg(tmp_path, tmp_path / "latin1.txt")


def empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    return text_cfg(tmp_path, tmp_path / "empty")


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="wiki"), "^data.name='wiki' is unknown; use one of stdlib, shakespeare_char, shakespeare, text$"),
    (dict(tokenizer="bpe"), "^data.tokenizer='bpe' is unknown; use one of char, gpt2$"),
    (dict(val_fraction=1.0), "^data.val_fraction=1.0 must be between 0 and 1, e.g. 0.1$"),
    (dict(val_fraction=0.0), "^data.val_fraction=0.0 must be between 0 and 1"),
    (dict(path="notes.txt"), "^data=stdlib reads the Python standard library, not data.path .*; add data=text to"),
    (dict(url=URL), "^data=stdlib reads the Python standard library, not data.path or data.url"),
])
def test_a_data_config_rejects_bad_values_when_made(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataConfig(dir=str(tmp_path), **kwargs)


@pytest.mark.parametrize("make_cfg, error, match", [
    (lambda p: DataConfig(name="text", dir=str(p)), ValueError, "data=text needs a text: pass data.path=FILE"),
    (lambda p: text_cfg(p, p / "missing.txt"), FileNotFoundError, "missing.txt does not exist; pass data.path="),
    (lambda p: text_cfg(p, write(p / "empty.txt", "")), ValueError, "holds no text"),
    (empty_folder, ValueError, "holds no .txt or .md files"),
    (bad_bytes, ValueError, r"latin1.txt is not UTF-8 \(byte 3 is b'\\xe9'\); convert it"),
    (lambda p: text_cfg(p, write(p / "a.txt", "x" * 100)), ValueError,
     "corpus text has only 10 validation tokens but block_size=64 needs 65; use a longer text or a smaller model"),
])
def test_user_mistakes_give_one_line(tmp_path, make_cfg, error, match):
    with pytest.raises(error, match=match) as info:
        prepare(make_cfg(tmp_path), block_size=64)
    assert "\n" not in str(info.value)


# ---- the prepare command and its presets ----

def test_prepare_command(tmp_path, monkeypatch, capsys):
    for preset in sorted((REPO / "configs/data").glob("*.yaml")):
        assert compose(f"data={preset.stem}").data.name == preset.stem
    path = write(tmp_path / "a.txt", corpus_text())
    monkeypatch.setattr(sys, "argv", ["prepare", "data=text", f"data.path={path}", f"data.dir={tmp_path}",
                                      "model.block_size=16"])
    prepare_main()
    assert "900 train and 100 validation tokens, vocab_size=10" in capsys.readouterr().out


def prepare_in_a_process(args):
    corpus_path, data_dir = args
    return str(prepare(DataConfig(name="text", path=corpus_path, dir=data_dir), block_size=8))


def test_processes_preparing_one_corpus_at_once_agree_and_build_it_once(tmp_path):
    """Sweep jobs that start together: one builds the folder under a lock, the others wait for it and reuse it."""
    path = str(write(tmp_path / "a.txt", corpus_text(20000)))
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        folders = pool.map(prepare_in_a_process, [(path, str(tmp_path / "prepared"))] * 3)
    assert len(set(folders)) == 1
    assert load_meta(folders[0])["train_tokens"] + load_meta(folders[0])["val_tokens"] == 20000
