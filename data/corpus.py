"""Corpora: tokenize one once into a folder holding train.bin, val.bin (token ids) and meta.json, and read it back.

Corpora (presets in configs/data/): stdlib, the running Python's standard library source (no network; the default);
shakespeare_char and shakespeare, tiny Shakespeare with characters or GPT-2 BPE tokens; text, your own UTF-8 file
or folder of .txt/.md files. train.py calls prepare() itself; `python -m data.prepare` prepares ahead of training.
A folder is reused until its source changes (size or modification time of a file, the URL, the Python install).
"""
import hashlib
import json
import os
import platform
import re
import sysconfig
import urllib.request
from pathlib import Path

import numpy as np
from filelock import FileLock
from tqdm import tqdm

from config import DataConfig
from data.tokenizers import CharTokenizer, GPT2Tokenizer

TEXT_SUFFIXES = (".txt", ".md")
STDLIB_BYTES = 3_500_000  # enough for ~5 minutes of char-level training on 2 CPU cores without much overfitting
DOWNLOAD_TIMEOUT_S = 30
PIECE_CHARS = 1 << 20  # tokenize this many characters at a time, so large corpora get a progress bar


def load_meta(folder) -> dict:
    return json.loads((Path(folder) / "meta.json").read_text(encoding="utf-8"))


def load_split(folder, split) -> np.memmap:
    return np.memmap(Path(folder) / f"{split}.bin", dtype=load_meta(folder)["dtype"], mode="r")


def prepare(cfg: DataConfig, block_size: int) -> Path:
    """Tokenize the corpus into Path(cfg.dir)/<name>-<tokenizer>-<source hash> once; reuse it while it is current."""
    source, files = _locate(cfg)
    folder = Path(cfg.dir) / f"{cfg.name}-{cfg.tokenizer}-{hashlib.sha256(source.encode()).hexdigest()[:8]}"
    fingerprint = _fingerprint(files) if files else source
    bpe_file = str(Path(cfg.bpe_file).resolve()) if cfg.tokenizer == "gpt2" and cfg.bpe_file else None
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{folder}.lock"):  # sweep jobs starting together: one prepares, the others wait and reuse it
        meta = load_meta(folder) if (folder / "meta.json").exists() else {}
        current = (meta.get("fingerprint") == fingerprint and meta.get("val_fraction") == cfg.val_fraction
                   and meta["tokenizer"].get("bpe_file") == bpe_file)
        if not current:
            meta = _build(cfg, folder, source, files, fingerprint)
    for split in ("train", "val"):
        n = meta[f"{split}_tokens"]
        if n < block_size + 1:
            name = "validation" if split == "val" else split
            raise ValueError(f"corpus {cfg.name} has only {n} {name} tokens but block_size={block_size} needs "
                             f"{block_size + 1}; use a longer text or a smaller model.block_size")
    return folder


def _locate(cfg):
    """The source's identity (a resolved path, a URL or the stdlib folder) and its local files (None for a URL)."""
    if cfg.name == "stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        # Top-level modules read like ordinary Python; _sysconfigdata* is machine-specific, this.py is rot13.
        files = [p for p in sorted(root.glob("*.py"))
                 if not p.name.startswith("_sysconfigdata") and p.name != "this.py"]
        return str(root), files
    if cfg.path:
        path = Path(cfg.path).expanduser().resolve()
        if not path.exists():
            raise FileNotFoundError(f"data.path={cfg.path} does not exist; pass data.path=FILE or a folder of "
                                    f".txt/.md files")
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*")
                                                      if p.suffix in TEXT_SUFFIXES and p.is_file())
        if not files:
            raise ValueError(f"data.path={cfg.path} holds no .txt or .md files; pass data.path=FILE or a folder "
                             f"of them")
        return str(path), files
    if cfg.url:
        return cfg.url, None
    raise ValueError(f"data={cfg.name} needs a text: pass data.path=FILE (a UTF-8 text file or a folder of .txt/.md "
                     f"files)")


def _fingerprint(files):
    stats = "\n".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    return hashlib.sha256(stats.encode()).hexdigest()[:16]


def _build(cfg, folder, source, files, fingerprint):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").unlink(missing_ok=True)  # written last: a folder without it is never reused
    extra = {}
    if cfg.name == "stdlib":
        text, used = _read_stdlib(files)
        extra = {"python_version": platform.python_version(), "files": used}
    elif files:
        texts = [decode_utf8(p.read_bytes(), str(p)) for p in files]
        text = "\n\n".join(texts)
        extra = {"files": len(files)}
    else:
        text = _download(cfg.url, folder / "input.txt")
    if not text.strip():
        raise ValueError(f"corpus {cfg.name} from {source} holds no text; pass data.path= a file with some text")

    tokenizer = CharTokenizer(sorted(set(text))) if cfg.tokenizer == "char" else GPT2Tokenizer(cfg.bpe_file)
    ids = _tokenize(tokenizer, text)
    n_train = len(ids) - int(len(ids) * cfg.val_fraction)  # the last val_fraction of the stream is validation
    _replace(folder / "train.bin", ids[:n_train].tofile)
    _replace(folder / "val.bin", ids[n_train:].tofile)
    meta = {"name": cfg.name, "source": source, "fingerprint": fingerprint, "tokenizer": tokenizer.spec(),
            "vocab_size": tokenizer.vocab_size, "dtype": ids.dtype.name, "val_fraction": cfg.val_fraction,
            "train_tokens": n_train, "val_tokens": len(ids) - n_train, **extra}
    _replace(folder / "meta.json", lambda tmp: tmp.write_text(json.dumps(meta, indent=1), encoding="utf-8"))
    return meta


def _read_stdlib(files):
    """Whole files in sorted order, up to STDLIB_BYTES, each under a comment naming it."""
    parts, total = [], 0
    for p in files:
        raw = p.read_bytes()
        if not raw.isascii():  # keeps the vocabulary to ~100 characters: a character seen once cannot be learned
            continue
        source = raw.decode("ascii")
        total += len(source)
        if total > STDLIB_BYTES:
            break
        parts.append(f"# {p.name}\n{source}")
    return "\n\n".join(parts), len(parts)


def decode_utf8(raw, where):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where} is not UTF-8 (byte {e.start} is {raw[e.start:e.start + 1]!r}); convert it, e.g. "
                         f"iconv -f latin1 -t utf-8, or leave it out") from None


def _download(url, cache):
    if not cache.exists():
        print(f"downloading {url}")
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                raw = response.read()
        except OSError as e:  # URLError, HTTPError and timeouts are all OSErrors
            raise ValueError(f"could not download {url} ({getattr(e, 'reason', e)}); download it yourself and pass "
                             f"data.path=FILE") from None
        decode_utf8(raw, url)
        _replace(cache, lambda tmp: tmp.write_bytes(raw))
    return decode_utf8(cache.read_bytes(), str(cache))


# A newline between two non-space characters ends one GPT-2 pre-token and starts the next, so cutting the text
# just after it gives the same tokens as encoding the whole text at once (tests/test_data.py checks this).
_CUT = re.compile(r"(?<=\S)\n(?=\S)")


def _pieces(text, size=PIECE_CHARS):
    start = 0
    while start < len(text):
        cut = _CUT.search(text, start + size)
        end = cut.end() if cut else len(text)
        yield text[start:end]
        start = end


def _tokenize(tokenizer, text):
    dtype = np.uint16 if tokenizer.vocab_size < 2 ** 16 else np.uint32
    chunks = []
    with tqdm(total=len(text), desc="tokenizing", unit="char", unit_scale=True, disable=len(text) < PIECE_CHARS) as bar:
        for piece in _pieces(text):
            chunks.append(np.array(tokenizer.encode(piece), dtype=dtype))
            bar.update(len(piece))
    return np.concatenate(chunks)


def _replace(path, write):
    """Write through a temporary file and rename it, so a killed prepare never leaves a torn file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)
