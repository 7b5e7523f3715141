"""sample.py on a tiny trained run: seeded, streamed, batched with padding, with and without the cache."""
import io
import subprocess
import sys
from pathlib import Path

import pytest

from config import SampleConfig
from sample import quote_prompts, sample

ROOT = Path(__file__).resolve().parent.parent


def generate(out_dir, **kw):
    kw.setdefault("max_new_tokens", 40)
    return sample(SampleConfig(out_dir=out_dir, device="cpu", **kw), out=io.StringIO())


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
    (dict(prompt="def é"), "characters the model's vocabulary lacks: 'é'"),
    (dict(prompt="def f(x):" * 10), "longer than the model's block_size=32"),
    (dict(top_p=0.0), "top_p"), (dict(temperature=-1.0), "temperature"), (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(checkpoint="newest"), "checkpoint='newest' is unknown"), (dict(prompt_file="missing.txt"), "prompt_file")])
def test_bad_input_is_named(tiny_run, kw, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        generate(tiny_run, **kw)


def test_cli_takes_free_text_prompts(tiny_run):
    prompt = "f(x): {'a': x} # it's ${x}"
    assert quote_prompts(["sample.py", f"prompt={prompt}"])[1].startswith("prompt='")
    result = subprocess.run([sys.executable, "sample.py", f"out_dir={tiny_run}", f"prompt={prompt}",
                             "max_new_tokens=5", "device=cpu"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(prompt) and len(result.stdout) == len(prompt) + 5 + 1
