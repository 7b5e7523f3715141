"""scripts/evaluate.py: a checkpoint scored on the whole of a text or of its run's split, as scoring.full_score scores
it; perplexity and bits per byte from the same total (hand-counted bytes for multi-byte characters and BPE tokens); a
GRU too; the CLI prints the numbers (its mistakes are in tests/test_bad_inputs.py)."""
import io
import json
import math
import re
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from conftest import compose, run_in_process, tiny_config

from attnlab.checkpoint import build_model, load_model, save_checkpoint
from attnlab.config import DataConfig, EvalConfig, ModelConfig
from attnlab.scoring import byte_counts, full_score
from data.corpus import load_split
from data.tokenizers import CharTokenizer, GPT2Tokenizer, load_tokenizer
from scripts.evaluate import evaluate
from train import train

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
HELD_OUT = "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n\n" * 20  # not in CORPUS


def scored(**kw):
    """scripts/evaluate.py's result for EvalConfig(**kw) on the CPU, its printout discarded."""
    return evaluate(EvalConfig(device="cpu", dtype="float32", **kw), out=io.StringIO())


def val_split(out_dir):
    """The val split that tiny_config's run in out_dir trained on."""
    return load_split(next((Path(out_dir).parent / "data").glob("*/meta.json")).parent, "val")


def untrained_run(out_dir, tokenizer):
    """out_dir holding an untrained model's checkpoint for tokenizer: all scripts/evaluate.py needs to score a text."""
    torch.manual_seed(0)
    model_cfg = ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2, n_embd=16, block_size=8)
    out_dir.mkdir(parents=True)
    save_checkpoint(out_dir / "ckpt.pt", {"model": build_model(model_cfg).state_dict(), "model_config":
                                          asdict(model_cfg), "meta": {"name": "text", "fingerprint": "the old one",
                                                                      "tokenizer": tokenizer.spec()}})
    return out_dir


def test_the_val_split_scores_as_full_loss(tiny_run):
    result = scored(out_dir=tiny_run, batch_size=8)
    model, meta = load_model(tiny_run)
    val = val_split(tiny_run)
    assert result["loss"] == full_score(model, val, 8, 32, byte_counts(load_tokenizer(meta), CPU)).loss
    assert result["tokens"] == result["bytes"] == len(val) - 1  # an ASCII corpus: one byte per character
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]), rel=1e-12)
    # bits per byte sum per-token losses, the loss sums batch means: equal up to fp32 rounding
    assert result["bits_per_byte"] == pytest.approx(result["loss"] / math.log(2), rel=1e-6)
    assert 0 < result["loss"] < math.log(meta["vocab_size"])  # it learned: better than a uniform guess


def test_the_batch_size_changes_only_the_rounding(tiny_run):
    assert scored(out_dir=tiny_run, batch_size=3)["loss"] == pytest.approx(scored(out_dir=tiny_run)["loss"], rel=1e-5)


def test_a_held_out_text_scores_every_token(tiny_run, tmp_path):
    (tmp_path / "held_out.txt").write_text(HELD_OUT)
    result = scored(out_dir=tiny_run, text=str(tmp_path / "held_out.txt"), checkpoint="latest")
    assert result["tokens"] == result["bytes"] == len(HELD_OUT) - 1
    assert math.isfinite(result["loss"]) and result["loss"] > 0
    assert result["bits_per_byte"] == pytest.approx(result["loss"] / math.log(2), rel=1e-6)  # fp32 sums


def test_multi_byte_characters_lower_bits_per_byte_by_the_byte_ratio(tmp_path):
    text = "aé€" * 20  # 1, 2 and 3 UTF-8 bytes
    run = untrained_run(tmp_path / "run", CharTokenizer("aé€"))
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    result = scored(out_dir=str(run), text=str(tmp_path / "text.txt"))
    assert (result["tokens"], result["bytes"]) == (59, 20 * 6 - 1)  # every character but the first is predicted
    assert result["bits_per_byte"] == pytest.approx(result["loss"] / math.log(2) * 59 / 119, rel=1e-6)


def test_bpe_bytes_are_the_text_s_bytes_after_the_first_token(tmp_path, tiny_bpe):
    tokenizer = GPT2Tokenizer(tiny_bpe)
    text = "hello wörld, hello €uro\n" * 4
    run = untrained_run(tmp_path / "run", tokenizer)
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    result = scored(out_dir=str(run), text=str(tmp_path / "text.txt"))
    ids = tokenizer.encode(text)
    assert tokenizer.token_bytes(ids).sum() == len(text.encode())  # "ö" and "€" are split across byte tokens
    assert result["tokens"] == len(ids) - 1 and result["bytes"] == len(text.encode()) - len(b"he")


def test_a_gru_scores_its_val_split_in_windows_of_its_block_size(tmp_path):
    cfg = tiny_config(tmp_path, max_iters=4, eval_interval=4)
    cfg = replace(cfg, model=ModelConfig(type="gru", n_layer=1, n_embd=32, block_size=32))
    train(cfg)
    result = scored(out_dir=cfg.out_dir, split="val", batch_size=8)
    model, meta = load_model(cfg.out_dir)
    expected = full_score(model, val_split(cfg.out_dir), 8, 32, byte_counts(load_tokenizer(meta), CPU))
    assert result["block_size"] == 32 and result["loss"] == expected.loss


def test_a_split_is_refused_when_the_corpus_changed_since_training(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("ab" * 100)
    run = untrained_run(tmp_path / "run", CharTokenizer("ab"))
    data = DataConfig(name="text", path=str(corpus), dir=str(tmp_path / "prepared"))
    (run / "config.json").write_text(json.dumps({"config": {"data": asdict(data)}}))
    with pytest.raises(ValueError, match="changed since the run in .* trained on it; pass text=FILE"):
        scored(out_dir=str(run))


def test_json_prints_the_result_as_one_object(tiny_run):
    out = io.StringIO()
    result = evaluate(EvalConfig(out_dir=tiny_run, device="cpu", json=True), out=out)
    assert json.loads(out.getvalue()) == result


def test_the_config_composes_and_checks_its_values():
    assert compose("split=train", "batch_size=4", config_name="evaluate") == EvalConfig(split="train", batch_size=4)
    for kw, fix in [(dict(text="a.txt", split="val"), "pass text=FILE or split=val|train, not both"),
                    (dict(split="test"), "split='test' is unknown; use val or train"),
                    (dict(checkpoint="newest"), "checkpoint='newest' is unknown; use best or latest"),
                    (dict(batch_size=0), "batch_size=0 must be >= 1")]:
        with pytest.raises(ValueError, match=re.escape(fix)):
            EvalConfig(**kw)


def test_a_missing_run_or_a_one_token_text_names_the_fix(tmp_path):
    (tmp_path / "one.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="no checkpoint in .*; train one with: python train.py out_dir="):
        scored(out_dir=str(tmp_path / "nowhere"))
    run = untrained_run(tmp_path / "run", CharTokenizer("x"))
    with pytest.raises(ValueError, match=r"one.txt holds 1 token\(s\) but scoring needs 2 or more"):
        scored(out_dir=str(run), text=str(tmp_path / "one.txt"))


def test_the_cli_prints_the_numbers(tiny_run):
    expected = scored(out_dir=tiny_run)
    code, out, err = run_in_process("-m scripts.evaluate", f"out_dir={tiny_run}", "device=cpu", "dtype=float32")
    assert code == 0, err
    assert f"{expected['tokens']:,} tokens scored" in out
    for line in (f"loss        {expected['loss']:.4f} nats/token", f"perplexity  {expected['perplexity']:.3f}",
                 f"bits/byte   {expected['bits_per_byte']:.4f}"):
        assert line in out
