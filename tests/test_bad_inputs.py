"""Bad and hostile input: every mistake through the real CLI ends with one line naming the fix, exit status 2 and no
traceback; a checkpoint that would run code when unpickled is refused by train.py and sample.py without running it."""
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from attnlab.config import SampleConfig
from conftest import TINY, FakeClock, compose, data_overrides, run_script
from sample import sample
from train import train


class RunsCode:
    """Unpickling this calls open(marker, "w"): a stand-in for any code a hostile checkpoint could run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.fixture
def files(tmp_path, one_thread):
    """A words corpus, a trained tiny run, and the broken things the cases point at."""
    root = tmp_path
    data = data_overrides(root)
    (root / "other.txt").write_text("ABCDEFGHIJ KLMNOP\n" * 200)  # another character vocabulary
    (root / "empty.txt").write_text("")
    (root / "binary.txt").write_bytes(bytes(range(256)) * 8)
    train(compose(*TINY, *data, f"out_dir={root / 'run'}"), clock=FakeClock())
    (root / "truncated").mkdir()
    ckpt = (root / "run" / "ckpt.pt").read_bytes()
    (root / "truncated" / "ckpt.pt").write_bytes(ckpt[:len(ckpt) // 2])
    (root / "hostile").mkdir()
    torch.save({"model": RunsCode(root / "marker"), "model_config": {}, "meta": {}}, root / "hostile" / "ckpt.pt")
    return root, data


# case: (script, arguments, the fix its one-line message must name); {root} is the fixture's folder
CASES = {
    "unknown key": ("train.py", "train.lr=0.1", "Key 'lr' not in 'TrainConfig'; python train.py --help lists"),
    "wrong value type": ("train.py", "train.batch_size=ten", "'ten' of type 'str' could not be converted to Integer"),
    "unknown preset": ("train.py", "data=wikipedia", "the choices are shakespeare, shakespeare_char, stdlib, text"),
    "n_embd not divisible by n_head": ("train.py", "model.n_embd=30 model.n_head=4",
                                       "pick n_embd a multiple of n_head"),
    "n_head 0": ("train.py", "model.n_head=0", "n_head=0 must be positive"),  # was a ZeroDivisionError
    "unknown model type": ("train.py", "model.type=transformer",
                           "model.type='transformer' is unknown; use one of gpt, lstm, gru"),
    "negative learning rate": ("train.py", "train.learning_rate=-1", "train.learning_rate=-1.0 must be positive"),
    "batch_size 0": ("train.py", "train.batch_size=0", "train.batch_size=0 must be positive"),
    "unknown schedule": ("train.py", "train.schedule=step", "train.schedule='step' is unknown; use one of cosine, wsd"),
    "cooldown 0": ("train.py", "train.schedule=wsd train.cooldown=0", "train.cooldown=0.0 must be in (0, 1]"),
    "Polar Express past its coefficients": ("train.py", "train.muon_ns=polar_express train.muon_ns_steps=6",
                                            "train.muon_ns_steps=6 must be at most 5 with train.muon_ns=polar_express"),
    "log_interval 0": ("train.py", "logger.log_interval=0", "logger.log_interval=0 must be positive"),
    "unknown device": ("train.py", "train.device=tpu", "use auto, cpu, cuda, cuda:N or mps"),
    "block_size longer than the corpus": ("train.py", "model.block_size=100000",
                                          "use a longer text or a smaller model.block_size"),
    "missing corpus": ("train.py", "data.path={root}/missing.txt", "does not exist; pass data.path=FILE"),
    "empty corpus": ("train.py", "data.path={root}/empty.txt", "holds no text; pass data.path= a file with some text"),
    "binary corpus": ("train.py", "data.path={root}/binary.txt", "is not UTF-8"),
    "unknown tokenizer": ("train.py", "data.tokenizer=wordpiece",
                          "data.tokenizer='wordpiece' is unknown; use one of char, gpt2, bpe"),
    "BPE vocabulary the corpus cannot fill": ("train.py", "data.tokenizer=bpe",
                                              "data.bpe_vocab_size=4096 is more than the corpus can fill"),
    "unknown data name": ("train.py", "data.name=wiki", "data.name='wiki' is unknown; use one of stdlib"),
    "val_fraction 2": ("train.py", "data.val_fraction=2", "data.val_fraction=2.0 must be between 0 and 1"),
    "fresh run into a checkpoint": ("train.py", "out_dir={root}/run", "pass train.resume=true to continue it, or"),
    "resume with another shape": ("train.py", "out_dir={root}/run train.resume=true model.n_layer=3",
                                  "n_layer=2 vs 3; drop those overrides or use a new out_dir"),
    "resume with another optimizer": ("train.py", "out_dir={root}/run train.resume=true train.optimizer=adamw",
                                      "trained with train.optimizer=muon, not adamw; resume with train.optimizer=muon"),
    "resume without a checkpoint": ("train.py", "train.resume=true", "train without resume first"),
    "resume a truncated checkpoint": ("train.py", "out_dir={root}/truncated train.resume=true",
                                      "it is truncated or not a checkpoint; delete it or pick another out_dir"),
    "resume with another vocabulary": ("train.py", "out_dir={root}/run train.resume=true data.path={root}/other.txt",
                                       "resume with the run's original data settings"),
    "prompt outside the vocabulary": ("sample.py", "out_dir={root}/run prompt=Zebra!",
                                      "vocabulary lacks: '!', 'Z'; remove them"),
    "prompt longer than block_size": ("sample.py", "out_dir={root}/run prompt=" + "thecat" * 5,
                                      "longer than the model's block_size=16; shorten it"),
    "top_p 0": ("sample.py", "out_dir={root}/run top_p=0", "top_p=0.0 must be in (0, 1]"),
    "max_new_tokens < 0": ("sample.py", "out_dir={root}/run max_new_tokens=-1", "max_new_tokens=-1 must be >= 0"),
    "negative temperature": ("sample.py", "out_dir={root}/run temperature=-1", "must be >= 0 (0 is greedy)"),
    "num_samples 0": ("sample.py", "out_dir={root}/run num_samples=0", "num_samples=0 must be >= 1"),
    "unknown checkpoint": ("sample.py", "out_dir={root}/run checkpoint=newest",
                           "checkpoint='newest' is unknown; use best or latest"),
    "missing out_dir": ("sample.py", "out_dir={root}/nowhere", "train one with: python train.py out_dir="),
    "sample a checkpoint that runs code": ("sample.py", "out_dir={root}/hostile",
                                           "(io.open) that would run code when loaded, which is refused"),
    "unknown sample key": ("sample.py", "temp=0.5", "Key 'temp' not in 'SampleConfig'; python sample.py --help"),
    "prepare: unknown key": ("-m data.prepare", "data.pth=x", "Key 'pth' not in 'DataConfig'; python train.py --help"),
    "prepare: missing corpus": ("-m data.prepare", "data=text data.path={root}/missing.txt",
                                "does not exist; pass data.path=FILE"),
}


def run_case(case, root, data):
    script, args, _ = CASES[case]
    args = [a.format(root=root) for a in args.split(" ")]
    if script == "train.py":
        args = [*TINY, *data, f"out_dir={root / case.replace(' ', '-')}", *args]
    return run_script(*script.split(), *args, timeout=300)


@pytest.mark.slow
def test_every_mistake_ends_in_one_line_naming_the_fix(files):
    root, data = files
    with ThreadPoolExecutor(3) as pool:  # each case is a fresh python process, mostly importing torch
        results = dict(zip(CASES, pool.map(lambda case: run_case(case, root, data), CASES)))
    wrong = []
    for case, (_, _, fix) in CASES.items():
        result = results[case]
        print(f"\n{case}: {result.stderr.strip()}", end="")
        if (result.returncode != 2 or "Traceback" in result.stdout + result.stderr or fix not in result.stderr
                or len(result.stderr.strip().splitlines()) != 1 or not result.stderr.startswith("error: ")):
            wrong.append(f"{case}: exit status {result.returncode}\n{result.stderr[-2000:]}")
    assert not wrong, "\n".join(wrong)
    assert not (root / "marker").exists()


def test_a_checkpoint_that_would_run_code_is_refused_without_running_it(tmp_path):
    marker, hostile = tmp_path / "marker", tmp_path / "hostile"
    hostile.mkdir()
    torch.save({"model": RunsCode(marker), "model_config": {}, "meta": {}}, hostile / "ckpt.pt")
    torch.load(hostile / "ckpt.pt", weights_only=False)["model"].close()  # the danger is real: unsafe loading runs it
    assert marker.exists()
    marker.unlink()

    refused = r"cannot load checkpoint .*ckpt.pt: it holds a Python object \(io.open\) that would run code"
    cfg = compose(*TINY, *data_overrides(tmp_path), f"out_dir={hostile}", "train.resume=true")
    with pytest.raises(ValueError, match=refused):
        train(cfg)
    with pytest.raises(ValueError, match=refused):
        sample(SampleConfig(out_dir=str(hostile), device="cpu"))
    assert not marker.exists()
