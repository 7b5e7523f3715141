"""A safe fine-tune, offline: a small GPT-2-shaped model pretrained here on one corpus, exported with the export
command, fine-tuned through train.init_from=<that folder> on another corpus with experiment=finetune_gpt2. The first
evaluation after the start stays near the loss before it, the new corpus's loss falls, and the from-scratch settings
are refused."""
import random

import pytest

pytest.importorskip("transformers")

from conftest import FakeClock  # noqa: E402

from attnlab.config import ExportConfig, compose  # noqa: E402
from attnlab.hf import GPT2_ARCH  # noqa: E402
from attnlab.record import read_metrics  # noqa: E402
from scripts.export import export  # noqa: E402
from train import train  # noqa: E402

SHAPE = [f"model.{key}={str(value).lower()}" for key, value in GPT2_ARCH.items()] + [
    "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32"]
FIRST = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"]
SECOND = ["a", "bird", "sang", "while", "the", "wind", "blew", "over", "hills", "far"]  # partly new words


def words(path, vocabulary, seed):
    rng = random.Random(seed)
    path.write_text(" ".join(rng.choice(vocabulary) for _ in range(4000)))
    return path


@pytest.mark.slow
def test_a_fine_tune_of_an_exported_model_starts_where_it_was_and_learns_the_new_text(tmp_path, tiny_bpe, one_thread):
    gpt2_tokens = ["data=text", "data.tokenizer=gpt2", f"data.bpe_file={tiny_bpe}", f"data.dir={tmp_path / 'p'}"]
    pretrain = compose(*gpt2_tokens, *SHAPE, f"data.path={words(tmp_path / 'first.txt', FIRST, 0)}",
                       "train.optimizer=adamw", "train.learning_rate=1e-2", "train.max_iters=40",
                       "train.warmup_iters=5", "train.eval_interval=40", "train.eval_iters=2", "train.batch_size=8",
                       "train.device=cpu", "train.dtype=float32", f"out_dir={tmp_path / 'pretrained'}")
    train(pretrain, clock=FakeClock())
    hf_dir = export(ExportConfig(out_dir=str(tmp_path / "pretrained")))

    second = [*gpt2_tokens, f"data.path={words(tmp_path / 'second.txt', SECOND, 1)}", "model.block_size=32"]
    tune = compose("experiment=finetune_gpt2", *second, f"train.init_from={hf_dir}", "train.batch_size=8",
                   "train.tokens_per_step=0", "train.max_iters=30", "train.eval_iters=2", "train.device=cpu",
                   "train.dtype=float32", f"out_dir={tmp_path / 'tuned'}")
    assert (tune.train.optimizer, tune.train.learning_rate, tune.train.min_lr, tune.train.warmup_iters) == (
        "adamw", 3e-5, 3e-5, 0)  # the preset's constant small rate
    train(tune, clock=FakeClock())
    evals = {row["iter"]: row["val_loss"] for row in read_metrics(tmp_path / "tuned", "eval")}
    assert abs(evals[5] - evals[0]) < 0.1 * evals[0]  # no blow-up: the published weights are kept
    assert evals[30] < evals[0] - 0.05  # and the new text is learnt

    with pytest.raises(ValueError, match="would erase the published weights' learning; add experiment=finetune_gpt2"):
        compose(*second, *SHAPE, f"train.init_from={hf_dir}")  # the from-scratch defaults: Muon at 2e-3
