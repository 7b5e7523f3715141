"""data/corpus.py: preparing and reusing corpora, and the one-line errors (data/tokenizers.py has its own
tests/test_tokenizers.py). Offline, seconds."""
import errno
import io
import multiprocessing
import platform
import shutil
import sys
import urllib.error

import numpy as np
import pytest
from conftest import REPO, compose
from hypothesis import given, settings
from hypothesis import strategies as st

import data.corpus as corpus
from attnlab.config import DataConfig
from data.corpus import load_meta, load_split, prepare
from data.prepare import main as prepare_main
from data.tokenizers import BPETokenizer, GPT2Tokenizer, load_tokenizer

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

@pytest.fixture(scope="module")
def bpes(tiny_bpe):
    """A GPT-2 BPE (GPT-2's pre-tokenizer) and a BPE trained here (GPT-4's): the safe cuts must hold for both."""
    return [GPT2Tokenizer(tiny_bpe), BPETokenizer.train(["ab ba\n1é. ab\n\tab" * 20], 264)]


@settings(max_examples=200)
@given(st.text(alphabet="ab \n\t\r'1é.", max_size=60), st.integers(1, 8))
def test_a_text_read_in_pieces_tokenizes_as_the_whole(bpes, text, read_bytes):
    pieces = list(corpus._text_pieces(io.BytesIO(text.encode()), "t.txt", read_bytes))
    assert "".join(t for t, _, _ in pieces) == text and [last for _, last, _ in pieces][-1]
    assert sum(n for _, _, n in pieces) == len(text.encode())
    for tok in bpes:
        assert [i for t, _, _ in pieces for i in tok.encode(t)] == tok.encode(text)


def test_a_character_split_across_reads_decodes_and_a_bad_byte_is_placed():
    text = "é€" * 10
    pieces = list(corpus._text_pieces(io.BytesIO(text.encode()), "t.txt", 1))
    assert "".join(t for t, _, _ in pieces) == text
    with pytest.raises(ValueError, match=r"^t.txt is not UTF-8 \(byte 4 is b'\\xe9'\); convert it"):
        list(corpus._text_pieces(io.BytesIO(b"ab\xc3\xa9\xe9 ok"), "t.txt", 3))


@pytest.mark.parametrize("tokenizer, ending", [("char", ""), ("gpt2", "<|endoftext|>"), ("bpe", "<|endoftext|>")])
def test_tokenizer_rebuilds_from_meta_alone(tmp_path, tiny_bpe, tokenizer, ending):
    cfg = text_cfg(tmp_path, write(tmp_path / "a.txt", "hello world\n" * 50), tokenizer=tokenizer,
                   bpe_file=str(tiny_bpe), bpe_vocab_size=260)
    folder = prepare(cfg, block_size=8)
    assert decoded(folder, "train") + decoded(folder, "val") == "hello world\n" * 50 + ending
    assert load_split(folder, "train").dtype == np.uint16
    meta = load_meta(folder)
    assert meta["text_bytes"] == 600 and meta["bytes_per_token"] == round(600 / meta["text_tokens"], 4)


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


DOCUMENTS = ["first document\n", "zweites Dokument: ä\n\n", "third\n\nwith a blank line", "4th", "fifth " * 30]


def document_folder(root, documents=DOCUMENTS, field="text"):
    """documents spread over a .txt file, a .jsonl, a .jsonl.gz and a .parquet file (sorted in that order)."""
    import gzip
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    write(root / "a.txt", documents[0])
    write(root / "b.jsonl", "".join(json.dumps({field: d, "id": i}) + "\n\n" for i, d in enumerate(documents[1:3])))
    with gzip.open(root / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({field: documents[3]}) + "\n")
    pq.write_table(pa.table({"id": [4, 5], field: [documents[4], None]}), root / "d.parquet", row_group_size=1)
    return root


@pytest.mark.parametrize("tokenizer", ["char", "gpt2", "bpe"])
def test_documents_of_every_kind_tokenize_each_on_its_own(tmp_path, tiny_bpe, tokenizer):
    cfg = text_cfg(tmp_path, document_folder(tmp_path / "docs"), tokenizer=tokenizer, bpe_file=str(tiny_bpe),
                   bpe_vocab_size=270)
    folder = prepare(cfg, block_size=4)
    tok, meta = load_tokenizer(load_meta(folder)), load_meta(folder)
    ids = np.concatenate([load_split(folder, "train"), load_split(folder, "val")]).tolist()
    if tokenizer == "char":  # no end-of-text token: a blank line between documents
        assert ids == tok.encode("\n\n".join(DOCUMENTS))
    else:
        assert ids == [i for d in DOCUMENTS for i in [*tok.encode(d), tok.eot_token]]
    assert meta["documents"] == 5 and meta["files"] == 4
    assert meta["text_bytes"] == len("".join(DOCUMENTS).encode()) + (8 if tokenizer == "char" else 0)


def test_workers_and_small_reads_give_the_tokens_of_one_whole_read(tmp_path, tiny_bpe, monkeypatch):
    text = "".join(f"line {i}: ünïcode and words\n" for i in range(3000))
    write(tmp_path / "docs/big.txt", text)
    document_folder(tmp_path / "docs/more")
    folders = {}
    for num_proc in (1, 2):
        monkeypatch.setattr(corpus, "READ_BYTES", 1000)  # many pieces per file
        monkeypatch.setattr(corpus, "TASK_CHARS", 5000)  # and many tasks, so 2 workers share them
        cfg = text_cfg(tmp_path / str(num_proc), tmp_path / "docs", tokenizer="gpt2", bpe_file=str(tiny_bpe),
                       num_proc=num_proc)
        folders[num_proc] = prepare(cfg, block_size=8)
    tok = GPT2Tokenizer(tiny_bpe)
    expected = [i for d in [text, *DOCUMENTS] for i in [*tok.encode(d), tok.eot_token]]
    for folder in folders.values():
        assert np.concatenate([load_split(folder, "train"), load_split(folder, "val")]).tolist() == expected
    assert all((folders[1] / f).read_bytes() == (folders[2] / f).read_bytes() for f in ("train.bin", "val.bin"))


def test_a_preparation_killed_midway_leaves_no_files_and_is_rebuilt(tmp_path, monkeypatch):
    path = write(tmp_path / "a.txt", corpus_text(20000))
    monkeypatch.setattr(corpus, "READ_BYTES", 1000)
    monkeypatch.setattr(corpus, "TASK_CHARS", 1000)
    calls = []

    def encode_then_die(self, task):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return encode(self, task)

    encode = corpus._Encoder.__call__
    with monkeypatch.context() as m:
        m.setattr(corpus._Encoder, "__call__", encode_then_die)
        with pytest.raises(KeyboardInterrupt):
            prepare(text_cfg(tmp_path, path, num_proc=1), block_size=16)
    assert len(calls) == 3
    left = [p for p in (tmp_path / "prepared").rglob("*") if p.suffix != ".lock"]
    assert left == []  # no folder, no meta.json, no partial train.bin, no temporary file
    assert load_meta(prepare(text_cfg(tmp_path, path), block_size=16))["train_tokens"] == 18000


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
    assert [p.suffix for p in tmp_path.iterdir()] == [".lock"]  # no empty folder left behind


@pytest.mark.parametrize("error, free, why", [
    (OSError(errno.ENOSPC, "No space left on device"), 10 ** 9, "No space left on device"),
    (OSError("4484120 requested and 1048576 written"), 4096, "the disk is full: 4,096 bytes were left")])
def test_a_full_disk_says_where_why_and_what_to_do(tmp_path, monkeypatch, error, free, why):
    path = write(tmp_path / "a.txt", corpus_text(2000))

    def tokenize(*args):
        raise error

    monkeypatch.setattr(corpus, "_tokenize", tokenize)
    monkeypatch.setattr(corpus.shutil, "disk_usage", lambda folder: shutil._ntuple_diskusage(10 ** 10, 0, free))
    with pytest.raises(OSError) as raised:
        prepare(text_cfg(tmp_path, path), block_size=16)
    message = str(raised.value)
    assert message.startswith(f"could not write the prepared corpus in {tmp_path / 'prepared'}/text-char-")
    assert f"({why}); free some space or pass data.dir=DIR on a disk with room" in message
    assert [p for p in (tmp_path / "prepared").iterdir() if p.suffix != ".lock"] == []


# ---- user mistakes: one line each, naming the fix ----

def bad_bytes(tmp_path):
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 au lait")
    return text_cfg(tmp_path, tmp_path / "latin1.txt")


def empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    return text_cfg(tmp_path, tmp_path / "empty")


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="wiki"), "^data.name='wiki' is unknown; use one of stdlib, shakespeare_char, shakespeare, text$"),
    (dict(tokenizer="wordpiece"), "^data.tokenizer='wordpiece' is unknown; use one of char, gpt2, bpe$"),
    (dict(num_proc=-1), r"^data.num_proc=-1 must be >= 0 \(0: one per CPU core\)$"),
    (dict(bpe_vocab_size=100), "^data.bpe_vocab_size=100 must be at least 258"),
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
    (empty_folder, ValueError, "holds no .txt/.md/.jsonl/.jsonl.gz/.parquet files"),
    (bad_bytes, ValueError, r"latin1.txt is not UTF-8 \(byte 3 is b'\\xe9'\); convert it"),
    (lambda p: text_cfg(p, write(p / "a.jsonl", '{"text": "ok"}\n{"body": "x"}\n')), ValueError,
     r"a.jsonl line 2 has no text field 'text' \(it has: body\); pass data.text_field=KEY"),
    (lambda p: text_cfg(p, write(p / "a.jsonl", '{"text": "ok"}\nnot json\n')), ValueError,
     r"a.jsonl line 2 is not UTF-8 JSON \(Expecting value: .*\); fix or remove that line"),
    (lambda p: text_cfg(p, document_folder(p / "docs"), text_field="content"), ValueError,
     r"b.jsonl line 1 has no text field 'content' \(it has: text, id\); pass data.text_field=KEY"),
    (lambda p: text_cfg(p, document_folder(p / "docs") / "d.parquet", text_field="content"), ValueError,
     r"d.parquet has no column 'content' \(it has: id, text\); pass data.text_field=COLUMN"),
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


@pytest.mark.slow  # three fresh processes, each importing torch
def test_processes_preparing_one_corpus_at_once_agree_and_build_it_once(tmp_path):
    """Sweep jobs that start together: one builds the folder under a lock, the others wait for it and reuse it."""
    path = str(write(tmp_path / "a.txt", corpus_text(20000)))
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        folders = pool.map(prepare_in_a_process, [(path, str(tmp_path / "prepared"))] * 3)
    assert len(set(folders)) == 1
    assert load_meta(folders[0])["train_tokens"] + load_meta(folders[0])["val_tokens"] == 20000
