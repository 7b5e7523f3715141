"""Shared helpers: tiny overrides, small corpora, a script runner (in a subprocess or in-process), config composition,
one tiny trained run."""
import base64
import contextlib
import importlib
import io
import os
import random
import subprocess
import sys
from pathlib import Path

# Tiny models run fastest on one thread, and a busy neighbour cannot stall a one-thread process as it stalls
# two threads that wait on each other; subprocesses (the CLI tests) inherit this too.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from attnlab.cli import quote_free_text, run_cli  # noqa: E402
from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig, compose  # noqa: E402, F401  (compose: for tests)
from train import train  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"  # tinyshakespeare.txt and gpt2.tiktoken, where this machine has them
# every printable ASCII character once, so that prompts may use any of them
CORPUS = "".join(map(chr, range(32, 127))) + "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n"
                                                    for i in range(400))
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "while", "birds", "sang"]
# the CLI's overrides for a run of seconds: data=text (pass data.path), a 2-layer model, CPU in fp32 (auto would take
# bf16 on a CPU with native bf16, and the tests' figures should not depend on which machine runs them)
TINY = ["data=text", "model.n_layer=2", "model.n_head=2", "model.n_embd=16", "model.block_size=16",
        "train.batch_size=2", "train.max_iters=2", "train.eval_iters=1", "train.device=cpu", "train.dtype=float32"]


def words_corpus(path, n_words=3000, seed=0):
    """A text of n_words random words out of WORDS, written to path; returns path."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(" ".join(rng.choice(WORDS) for _ in range(n_words)))
    return path


def data_overrides(tmp_path, n_words=3000):
    """data.path and data.dir overrides for a words corpus under tmp_path."""
    corpus = words_corpus(tmp_path / "corpus.txt", n_words)
    return [f"data.path={corpus}", f"data.dir={tmp_path / 'prepared'}"]


def run_script(*args, env=None, timeout=600):
    """`python ARGS...` in the repository root (a script or -m module), output captured."""
    return subprocess.run([sys.executable, *args], cwd=REPO, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


# each command as the CLI tests name it: (its module, the help_script its `__main__` block passes to run_cli)
COMMANDS = {"train.py": ("train", None), "sample.py": ("sample", None),
            "-m scripts.evaluate": ("scripts.evaluate", "-m scripts.evaluate"),
            "-m scripts.export": ("scripts.export", "-m scripts.export"),
            "-m data.prepare": ("data.prepare", "train.py")}


def run_in_process(command, *args):
    """`python COMMAND ARGS...` without a new process: the command's main() through run_cli, as its `__main__` block
    calls it, with sys.argv set so. Returns (exit status, stdout, stderr)."""
    name, help_script = COMMANDS[command]
    module = importlib.import_module(name)
    argv = [command if command.endswith(".py") else module.__file__, *args]
    if command == "sample.py":
        quote_free_text(argv, "prompt")  # sample.py's `__main__` block quotes free-text prompts first
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.setattr(sys, "argv", argv)
        patch.setenv("HYDRA_FULL_ERROR", "")  # run_cli sets it: unset during the call, as before it afterwards
        patch.delenv("HYDRA_FULL_ERROR")
        try:
            run_cli(module.main, help_script=help_script)
            code = 0
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def tiny_config(tmp_path, **train_kw):
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        tmp_path.mkdir(parents=True, exist_ok=True)
        corpus.write_text(CORPUS)
    train_cfg = dict(device="cpu", dtype="float32", batch_size=8, max_iters=30, eval_interval=10, eval_iters=2,
                     warmup_iters=5, learning_rate=3e-3)
    train_cfg.update(train_kw)
    return Config(model=ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32),
                  data=DataConfig(name="text", path=str(corpus), dir=str(tmp_path / "data")),
                  train=TrainConfig(**train_cfg), out_dir=str(tmp_path / "out"))


class FakeClock:
    """A clock for train(clock=...): each reading is `step` seconds after the last, so time-based behaviour
    (the time budget, tokens/s, elapsed_s) is the same on any machine."""

    def __init__(self, step=0.1):
        self.now, self.step = 1000.0, step

    def __call__(self):
        self.now += self.step
        return self.now


@pytest.fixture
def one_thread():
    """In-process runs use one thread, like the subprocesses: the same arithmetic, and no spinning on busy cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_bpe(tmp_path_factory):
    """A .tiktoken ranks file with every single byte plus three merges, so BPE round trips any text offline, filled to
    GPT-2's 50256 tokens with ones no merge reaches (0xff never occurs in UTF-8), so that every id decodes."""
    ranks = [bytes([b]) for b in range(256)] + [b"he", b"ll", b" w"]
    ranks += [b"\xff\xff" + i.to_bytes(2, "big") for i in range(50256 - len(ranks))]
    path = tmp_path_factory.mktemp("bpe") / "tiny.tiktoken"
    path.write_text("".join(f"{base64.b64encode(token).decode()} {rank}\n" for rank, token in enumerate(ranks)))
    return path


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """out_dir of a 2-layer model trained for 60 steps on CORPUS."""
    cfg = tiny_config(tmp_path_factory.mktemp("tiny_run"), max_iters=60, eval_interval=20)
    train(cfg)
    return cfg.out_dir
