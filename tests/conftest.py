"""Shared fixtures: a small corpus and one tiny trained run, made once per test session."""
import os

# Tiny models run fastest on one thread, and a busy neighbour cannot stall a one-thread process as it stalls
# two threads that wait on each other; subprocesses (the CLI tests) inherit this too.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from config import Config, DataConfig, ModelConfig, TrainConfig  # noqa: E402
from train import train  # noqa: E402

# every printable ASCII character once, so that prompts may use any of them
CORPUS = "".join(map(chr, range(32, 127))) + "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n"
                                                    for i in range(400))


def tiny_config(tmp_path, **train_kw):
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        tmp_path.mkdir(parents=True, exist_ok=True)
        corpus.write_text(CORPUS)
    train_cfg = dict(device="cpu", batch_size=8, max_iters=30, eval_interval=10, eval_iters=2, warmup_iters=5,
                     learning_rate=3e-3)
    train_cfg.update(train_kw)
    return Config(model=ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32),
                  data=DataConfig(name="text", path=str(corpus), dir=str(tmp_path / "data")),
                  train=TrainConfig(**train_cfg), out_dir=str(tmp_path / "out"))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """out_dir of a 2-layer model trained for 60 steps on CORPUS."""
    cfg = tiny_config(tmp_path_factory.mktemp("tiny_run"), max_iters=60, eval_interval=20)
    train(cfg)
    return cfg.out_dir
