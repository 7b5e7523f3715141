"""No warning in normal use: a run in bf16 autocast on the CPU (what train.dtype=auto takes where bf16 is native)
trains, samples and is evaluated with every warning an error."""
import io

import pytest
from conftest import tiny_config

from attnlab.config import EvalConfig, SampleConfig
from sample import sample
from scripts.evaluate import evaluate
from train import train


@pytest.mark.filterwarnings("error")
def test_train_sample_and_evaluate_in_bf16_warn_nothing(tmp_path, one_thread):
    cfg = tiny_config(tmp_path, dtype="bfloat16", max_iters=4, eval_interval=2)
    summary = train(cfg)
    assert summary["iters"] == 4
    out = io.StringIO()
    sample(SampleConfig(out_dir=cfg.out_dir, device="cpu", dtype="bfloat16", max_new_tokens=20, prompt="def"), out=out)
    assert out.getvalue().startswith("def")
    result = evaluate(EvalConfig(out_dir=cfg.out_dir, device="cpu", dtype="bfloat16"), out=io.StringIO())
    assert result["tokens"] > 0
