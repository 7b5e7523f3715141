"""sample.py on tiny trained runs (a GPT and an LSTM): seeded, streamed, batched with padding, with and without the
cache, through sample(cfg) and the CLI. CPU, seconds."""
import io
from dataclasses import replace

import pytest
from conftest import FakeClock, run_in_process, tiny_config

from attnlab.cli import quote_free_text
from attnlab.config import ModelConfig, SampleConfig
from sample import sample
from train import train


def generate(out_dir, **kw):
    kw.setdefault("max_new_tokens", 40)
    return sample(SampleConfig(out_dir=out_dir, device="cpu", dtype="float32", **kw), out=io.StringIO())


def test_same_seed_same_text_other_seed_other_text(tiny_run):
    a, b = generate(tiny_run, prompt="def", seed=7), generate(tiny_run, prompt="def", seed=7)
    assert a == b and a[0].startswith("def") and len(a[0]) == 3 + 40
    assert generate(tiny_run, prompt="def", seed=8) != a


def test_greedy_text_is_the_same_with_and_without_the_cache(tiny_run):
    kw = dict(prompt="def f1", temperature=0, max_new_tokens=60)  # past block_size=32: the window slides
    assert generate(tiny_run, **kw)[0][:32] == generate(tiny_run, kv_cache=False, **kw)[0][:32]


def test_prompts_of_different_lengths_batch_as_if_alone(tiny_run):
    prompts = ["def f12(x):\n", "re", "    return"]
    batched = generate(tiny_run, prompts=prompts, temperature=0, max_new_tokens=15)
    assert batched == [generate(tiny_run, prompt=p, temperature=0, max_new_tokens=15)[0] for p in prompts]


def test_a_single_sample_streams_token_by_token(tiny_run):
    class Recorder(io.StringIO):
        writes = 0

        def write(self, s):
            self.writes += 1
            return super().write(s)

    out = Recorder()
    texts = sample(SampleConfig(out_dir=tiny_run, device="cpu", prompt="def", max_new_tokens=20), out=out)
    assert out.writes >= 20 and out.getvalue() == texts[0] + "\n"


@pytest.mark.parametrize("kw, message", [
    (dict(top_p=0.0), "top_p"), (dict(temperature=-1.0), "temperature"), (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(checkpoint="newest"), "checkpoint='newest' is unknown"), (dict(num_samples=0), "num_samples=0 must be >= 1")])
def test_sample_config_rejects_bad_values_when_made(kw, message):
    with pytest.raises(ValueError, match=message):
        SampleConfig(**kw)


@pytest.mark.parametrize("kw, message", [
    (dict(prompt="def é"), "characters the model's vocabulary lacks: 'é'"),
    (dict(prompt="def f(x):" * 10), "longer than the model's block_size=32"),
    (dict(prompt=""), "the prompt is empty"), (dict(prompt_file="missing.txt"), "prompt_file")])
def test_bad_prompts_are_named(tiny_run, kw, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        generate(tiny_run, **kw)


def test_cli_takes_free_text_prompts(tiny_run):
    prompt = "f(x): {'a': x} # it's ${x}"
    assert quote_free_text(["sample.py", f"prompt={prompt}"], "prompt")[1].startswith("prompt='")
    code, out, err = run_in_process("sample.py", f"out_dir={tiny_run}", f"prompt={prompt}", "max_new_tokens=5",
                                    "device=cpu")
    assert code == 0, err
    assert out.startswith(prompt) and len(out) == len(prompt) + 5 + 1


def test_an_lstm_run_samples_like_a_gpt_run(tmp_path, one_thread):
    cfg = tiny_config(tmp_path, max_iters=20)
    cfg = replace(cfg, model=ModelConfig(type="lstm", n_layer=1, n_embd=32, block_size=32))
    train(cfg, clock=FakeClock())
    prompt = "def f1(x):" * 4  # longer than block_size: an RNN's state has no context limit
    texts = generate(cfg.out_dir, prompt=prompt, seed=3)
    assert texts == generate(cfg.out_dir, prompt=prompt, seed=3) != generate(cfg.out_dir, prompt=prompt, seed=4)
    assert texts[0].startswith(prompt) and len(texts[0]) == len(prompt) + 40
    code, out, err = run_in_process("sample.py", f"out_dir={cfg.out_dir}", f"prompt={prompt}", "seed=3",
                                    "max_new_tokens=40", "device=cpu", "dtype=float32")
    assert code == 0, err
    assert out == texts[0] + "\n"  # the CLI draws the same tokens from the same seed


def test_a_run_on_a_bpe_of_its_own_corpus_trains_and_samples(tmp_path):
    cfg = tiny_config(tmp_path, max_iters=4, eval_interval=4)
    cfg = replace(cfg, data=replace(cfg.data, tokenizer="bpe", bpe_vocab_size=400))
    train(cfg)
    text = generate(cfg.out_dir, prompt="def f1(x):", max_new_tokens=10, seed=3)[0]
    assert text.startswith("def f1(x):") and len(text) > len("def f1(x):")
