"""Corpora: tokenize one once into a folder holding train.bin, val.bin (token ids) and meta.json, and read it back.

Corpora (presets in configs/data/): stdlib, the running Python's standard library source (no network; the default);
shakespeare_char and shakespeare, tiny Shakespeare with characters or GPT-2 BPE tokens; text, your own UTF-8 file or
folder of documents: .txt and .md files (a file is a document), .jsonl and .jsonl.gz (a record's data.text_field is a
document) and .parquet (a row's data.text_field column, the form FineWeb and OpenWebText dumps come in).
train.py calls prepare() itself; `python -m data.prepare` prepares ahead of training.

Preparation streams, so memory stays bounded whatever the corpus's size: documents are read a piece at a time,
tokenized in order by data.num_proc worker processes, and written to disk as they come. With a BPE each document ends
with <|endoftext|>, so a batch can start at a document; with characters a blank line separates documents. The last
val_fraction of the token stream is the validation split. meta.json is written last: a killed preparation leaves a
folder that is rebuilt, never reused. A folder is reused until its source changes (size or modification time of a
file, the URL, the Python install) or a setting that shapes its tokens does.
"""
import codecs
import gzip
import hashlib
import json
import multiprocessing
import os
import platform
import shutil
import sysconfig
import urllib.request
from collections import deque
from pathlib import Path

import numpy as np
from filelock import FileLock
from tqdm import tqdm

from data.tokenizers import BPETokenizer, CharTokenizer, GPT2Tokenizer, load_tokenizer

DOCUMENT_SUFFIXES = (".txt", ".md", ".jsonl", ".jsonl.gz", ".parquet")
STDLIB_BYTES = 3_500_000  # enough that a few minutes of char-level training on a CPU overfits little
DOWNLOAD_TIMEOUT_S = 30
READ_BYTES = 1 << 20  # a text file is read this much at a time
TASK_CHARS = 1 << 20  # a worker tokenizes about this many characters at a time
MAX_PIECE_CHARS = 1 << 26  # a text with no safe cut (below) in this many characters is cut anyway
TASKS_AHEAD = 4  # tasks queued per worker: enough to keep each busy, few enough to bound memory
BPE_TRAIN_BYTES = 1 << 28  # tokenizer=bpe learns its merges from at most this much of the training text; rustbpe holds
# what it reads in memory (about 1.2 GB of RSS per GB read), so this bounds preparation's memory
DOCUMENT_SEPARATOR = "\n\n"  # between documents, with a tokenizer that has no end-of-text token


def load_meta(folder) -> dict:
    return json.loads((Path(folder) / "meta.json").read_text(encoding="utf-8"))


def load_split(folder, split) -> np.memmap:
    return np.memmap(Path(folder) / f"{split}.bin", dtype=load_meta(folder)["dtype"], mode="r")


def prepare(cfg, block_size: int) -> Path:
    """Tokenize the corpus into Path(cfg.dir)/<name>-<tokenizer>-<source hash> once; reuse it while it is current.
    cfg: the config's data section (attnlab/config.py's DataConfig), taken as it comes so data/ imports no attnlab."""
    source, files = _locate(cfg)
    identity = source + (f"|bpe_vocab_size={cfg.bpe_vocab_size}" if cfg.tokenizer == "bpe" else "")
    folder = Path(cfg.dir) / f"{cfg.name}-{cfg.tokenizer}-{hashlib.sha256(identity.encode()).hexdigest()[:8]}"
    settings = {"fingerprint": _fingerprint(files) if files else source, "val_fraction": cfg.val_fraction,
                "text_field": cfg.text_field,
                "bpe_file": str(Path(cfg.bpe_file).resolve()) if cfg.tokenizer == "gpt2" and cfg.bpe_file else None}
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{folder}.lock"):  # sweep jobs starting together: one prepares, the others wait and reuse it
        meta = load_meta(folder) if (folder / "meta.json").exists() else {}
        if meta.get("settings") != settings:
            meta = _build_or_clean_up(cfg, folder, source, files, settings)
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
                                    f"documents")
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*")
                                                      if p.name.endswith(DOCUMENT_SUFFIXES) and p.is_file())
        if not files:
            raise ValueError(f"data.path={cfg.path} holds no {'/'.join(DOCUMENT_SUFFIXES)} files; pass "
                             f"data.path=FILE or a folder of them")
        return str(path), files
    if cfg.url:
        return cfg.url, None
    raise ValueError(f"data={cfg.name} needs a text: pass data.path=FILE (a UTF-8 text file or a folder of "
                     f"documents)")


def _fingerprint(files):
    stats = "\n".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    return hashlib.sha256(stats.encode()).hexdigest()[:16]


def _build_or_clean_up(cfg, folder, source, files, settings):
    """_build, and a folder this call made is removed when it fails (a refused download leaves nothing behind); a
    failed write says where, why and what to do."""
    made = not folder.exists()
    try:
        return _build(cfg, folder, source, files, settings)
    except BaseException as e:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            raise OSError(f"could not write the prepared corpus in {folder} ({_why(e, folder.parent)}); free some "
                          f"space or pass data.dir=DIR on a disk with room, then run the same command again") from None
        raise


def _why(error, folder):
    """What a failed write's OSError means: its strerror, or a full disk where numpy's message says neither."""
    free = shutil.disk_usage(folder).free if folder.exists() else None
    if error.strerror:
        return error.strerror
    if free is not None and free < 2 ** 24:
        return f"the disk is full: {free:,} bytes were left"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _build(cfg, folder, source, files, settings):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").unlink(missing_ok=True)  # written last: a folder without it is never reused
    if files is None:
        files = [_download(cfg.url, folder / "input.txt")]
    corpus = Corpus(cfg, files)
    tokenizer = _tokenizer(cfg, corpus)
    counts = _tokenize(tokenizer, corpus, folder, cfg.val_fraction, _workers(cfg, corpus))
    if not counts["text_bytes"] or not corpus.has_text:
        raise ValueError(f"corpus {cfg.name} from {source} holds no text; pass data.path= a file with some text")
    extra = {"python_version": platform.python_version()} if cfg.name == "stdlib" else {}
    meta = {"name": cfg.name, "source": source, "settings": settings, "fingerprint": settings["fingerprint"],
            "tokenizer": tokenizer.spec(), "vocab_size": tokenizer.vocab_size,
            "dtype": _token_dtype(tokenizer).__name__, "val_fraction": cfg.val_fraction, "files": len(files),
            "documents": corpus.documents, **counts,
            "bytes_per_token": round(counts["text_bytes"] / max(1, counts["text_tokens"]), 4), **extra}
    _replace(folder / "meta.json", lambda tmp: tmp.write_text(json.dumps(meta, indent=1), encoding="utf-8"))
    return meta


class Corpus:
    """The corpus as a stream of pieces of documents, read afresh on each pass: `pieces()` yields (text, last, bytes
    read): last closes a document; bytes (of the source files) drive the progress bar."""

    def __init__(self, cfg, files):
        self.cfg, self.files = cfg, files
        self.total_bytes = sum(p.stat().st_size for p in files)
        if cfg.name == "stdlib":
            self.total_bytes = min(self.total_bytes, STDLIB_BYTES)
        self.documents, self.has_text = 0, False  # counted by the last pass

    def pieces(self):
        separator = "" if self.cfg.tokenizer != "char" else DOCUMENT_SEPARATOR
        self.documents, self.has_text, first_piece = 0, False, True
        for text, last, n_bytes in self._documents():
            if first_piece and self.documents:
                text = separator + text
            self.has_text = self.has_text or not text.isspace() and bool(text)
            first_piece = last
            self.documents += last
            yield text, last, n_bytes

    def _documents(self):
        if self.cfg.name == "stdlib":
            yield from _stdlib_documents(self.files)
            return
        for path in self.files:
            if path.name.endswith((".jsonl", ".jsonl.gz")):
                yield from _jsonl_documents(path, self.cfg.text_field)
            elif path.name.endswith(".parquet"):
                yield from _parquet_documents(path, self.cfg.text_field)
            else:
                with open(path, "rb") as f:
                    yield from _text_pieces(f, str(path), READ_BYTES)


def _stdlib_documents(files):
    """Whole files in sorted order, up to STDLIB_BYTES, each under a comment naming it."""
    total = 0
    for p in files:
        raw = p.read_bytes()
        if not raw.isascii():  # keeps the vocabulary to ~100 characters: a character seen once cannot be learned
            continue
        total += len(raw)
        if total > STDLIB_BYTES:
            break
        yield f"# {p.name}\n{raw.decode('ascii')}", True, len(raw)


def _last_cut(text):
    """The index just after the last newline between two non-space characters in text, 0 if there is none. A GPT-2
    pre-token ends at such a newline, so the text cut there tokenizes as the whole (tests/test_corpus.py)."""
    end = len(text) - 1
    while (i := text.rfind("\n", 0, end)) > 0:
        if not text[i - 1].isspace() and not text[i + 1].isspace():
            return i + 1
        end = i
    return 0


def _text_pieces(f, where, read_bytes):
    """A UTF-8 text (a binary file) as one document, in pieces that each end at a safe cut."""
    decoder, buffer, offset, unreported = codecs.getincrementaldecoder("utf-8")(), "", 0, 0
    while True:
        raw = f.read(read_bytes)
        pending = decoder.getstate()[0]  # the start of a character split across reads
        try:
            buffer += decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as e:
            position = offset - len(pending) + e.start
            bad = (pending + raw)[e.start:e.start + 1]
            raise ValueError(f"{where} is not UTF-8 (byte {position} is {bad!r}); convert it, e.g. iconv -f latin1 "
                             f"-t utf-8, or leave it out") from None
        offset, unreported = offset + len(raw), unreported + len(raw)
        if not raw:
            yield buffer, True, unreported
            return
        cut = _last_cut(buffer) or (len(buffer) if len(buffer) > MAX_PIECE_CHARS else 0)
        if cut:
            yield buffer[:cut], False, unreported
            buffer, unreported = buffer[cut:], 0


def _jsonl_documents(path, field):
    """One document per line of a .jsonl or .jsonl.gz file: the line's JSON object's field."""
    with open(path, "rb") as raw, (gzip.open(raw) if path.name.endswith(".gz") else raw) as lines:
        position = 0
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:  # UnicodeDecodeError and JSONDecodeError
                raise ValueError(f"{path} line {number} is not UTF-8 JSON ({e}); fix or remove that line") from None
            text = record.get(field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
                raise ValueError(f"{path} line {number} has no text field {field!r} (it has: {keys}); pass "
                                 f"data.text_field=KEY")
            yield text, True, raw.tell() - position
            position = raw.tell()


def _parquet_documents(path, field, rows_per_batch=1024):
    """One document per row of a .parquet file: the row's field column (rows with no text are skipped)."""
    import pyarrow.parquet as pq  # here: its import slows every run's start, and only .parquet corpora need it

    parquet = pq.ParquetFile(path)
    if field not in parquet.schema_arrow.names:
        raise ValueError(f"{path} has no column {field!r} (it has: {', '.join(parquet.schema_arrow.names)}); pass "
                         f"data.text_field=COLUMN")
    bytes_per_row = path.stat().st_size / max(1, parquet.metadata.num_rows)
    for batch in parquet.iter_batches(batch_size=rows_per_batch, columns=[field]):
        for text in batch.column(0).to_pylist():
            if text:
                yield text, True, bytes_per_row


def _tokenizer(cfg, corpus):
    """The corpus's tokenizer: GPT-2's; or learnt from the corpus in a first pass (its characters, or a BPE trained
    on up to BPE_TRAIN_BYTES of the training text, the share before the validation split)."""
    if cfg.tokenizer == "gpt2":
        return GPT2Tokenizer(cfg.bpe_file)
    with tqdm(total=corpus.total_bytes, desc=f"{cfg.tokenizer} vocabulary", unit="B", unit_scale=True,
              disable=corpus.total_bytes < READ_BYTES) as bar:
        def texts(limit=float("inf")):
            seen = 0
            for text, _, n_bytes in corpus.pieces():
                bar.update(n_bytes)
                seen += n_bytes
                yield text
                if seen >= limit:
                    return
        if cfg.tokenizer == "char":
            chars = set()
            for text in texts():
                chars.update(text)
            return CharTokenizer(sorted(chars))
        return BPETokenizer.train(texts(min(BPE_TRAIN_BYTES, corpus.total_bytes * (1 - cfg.val_fraction))),
                                  cfg.bpe_vocab_size)


def _token_dtype(tokenizer):
    return np.uint16 if tokenizer.vocab_size <= 2 ** 16 else np.uint32


def _workers(cfg, corpus):
    """Worker processes to tokenize with: data.num_proc or one per core; none for a corpus of one task, or inside a
    daemonic process (a pool's worker), which may not start processes."""
    if corpus.total_bytes <= TASK_CHARS or multiprocessing.current_process().daemon:
        return 1
    return cfg.num_proc or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())


class _Encoder:
    """Token ids of a task, a list of (text, last) pieces; a document's last piece gets the end-of-text token."""

    def __init__(self, tokenizer):
        self.tokenizer, self.dtype = tokenizer, _token_dtype(tokenizer)
        self.eot = getattr(tokenizer, "eot_token", None)

    def __call__(self, task):
        ids, eots, n_bytes = [], 0, 0
        for text, last in task:
            ids += self.tokenizer.encode(text, name="the corpus")
            n_bytes += len(text.encode("utf-8"))
            if last and self.eot is not None:
                ids.append(self.eot)
                eots += 1
        return np.array(ids, dtype=self.dtype), eots, n_bytes


_worker_encoder = None


def _start_worker(spec):
    global _worker_encoder
    _worker_encoder = _Encoder(load_tokenizer({"tokenizer": spec}))


def _encode_in_worker(task):
    return _worker_encoder(task)


def _tasks(corpus, bar):
    task, chars = [], 0
    for text, last, n_bytes in corpus.pieces():
        task.append((text, last))
        chars += len(text)
        bar.update(n_bytes)
        if chars >= TASK_CHARS:
            yield task
            task, chars = [], 0
    if task:
        yield task


def _encoded(tasks, tokenizer, num_proc):
    """Each task's (ids, end-of-text tokens, text bytes), in order: in this process, or in num_proc workers with at
    most TASKS_AHEAD tasks per worker in flight, so a large corpus never sits in memory."""
    if num_proc <= 1:
        yield from map(_Encoder(tokenizer), tasks)
        return
    with multiprocessing.Pool(num_proc, _start_worker, (tokenizer.spec(),)) as pool:
        pending = deque()
        for task in tasks:
            pending.append(pool.apply_async(_encode_in_worker, (task,)))
            if len(pending) >= TASKS_AHEAD * num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _tokenize(tokenizer, corpus, folder, val_fraction, num_proc):
    """Tokenize the corpus into folder's train.bin and val.bin (the last val_fraction of the stream); returns the
    counts meta.json records."""
    tmp = folder / f"tokens.{os.getpid()}.tmp"
    n_tokens = eots = text_bytes = 0
    try:
        with open(tmp, "wb") as out, tqdm(total=corpus.total_bytes, desc="tokenizing", unit="B", unit_scale=True,
                                          disable=corpus.total_bytes < READ_BYTES) as bar:
            for ids, task_eots, task_bytes in _encoded(_tasks(corpus, bar), tokenizer, num_proc):
                ids.tofile(out)
                n_tokens, eots, text_bytes = n_tokens + len(ids), eots + task_eots, text_bytes + task_bytes
        n_train = n_tokens - int(n_tokens * val_fraction)
        itemsize = np.dtype(_token_dtype(tokenizer)).itemsize
        with open(tmp, "rb") as tokens:
            tokens.seek(n_train * itemsize)
            _replace(folder / "val.bin", lambda path: _copy(tokens, path))
        os.truncate(tmp, n_train * itemsize)
        os.replace(tmp, folder / "train.bin")
    finally:
        tmp.unlink(missing_ok=True)
    return {"train_tokens": n_train, "val_tokens": n_tokens - n_train, "text_tokens": n_tokens - eots,
            "text_bytes": text_bytes}


def _copy(source, path):
    with open(path, "wb") as out:
        shutil.copyfileobj(source, out)


def decode_utf8(raw, where):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where} is not UTF-8 (byte {e.start} is {raw[e.start:e.start + 1]!r}); convert it, e.g. "
                         f"iconv -f latin1 -t utf-8, or leave it out") from None


def _download(url, cache):
    """The file at url, fetched once into cache."""
    if not cache.exists():
        print(f"downloading {url}")
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                _replace(cache, lambda path: _copy(response, path))
        except OSError as e:  # URLError, HTTPError and timeouts are all OSErrors
            raise ValueError(f"could not download {url} ({getattr(e, 'reason', e)}); download it yourself and pass "
                             f"data.path=FILE") from None
    return cache


def _replace(path, write):
    """Write through a temporary file and rename it, so a killed prepare never leaves a torn file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
