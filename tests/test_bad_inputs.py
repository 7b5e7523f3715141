"""Bad and hostile input: every mistake through the CLI ends with one line naming the fix, exit status 2 and no
traceback (each command's main() through its one-line-error wrapper, in-process; one case per command in a real
process); a checkpoint that would run code when unpickled is refused by train.py and sample.py without running it."""
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import TINY, FakeClock, compose, data_overrides, run_in_process, run_script

from attnlab.config import SampleConfig
from sample import sample
from train import train


class RunsCode:
    """Unpickling this calls open(marker, "w"): a stand-in for any code a hostile checkpoint could run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A words corpus, a trained tiny run, and the broken things the cases point at."""
    root = tmp_path_factory.mktemp("bad_inputs")
    data = data_overrides(root)
    (root / "other.txt").write_text("ABCDEFGHIJ KLMNOP\n" * 200)  # another character vocabulary
    (root / "empty.txt").write_text("")
    (root / "binary.txt").write_bytes(bytes(range(256)) * 8)
    (root / "accents.txt").write_text("café €", encoding="utf-8")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    train(compose(*TINY, *data, f"out_dir={root / 'run'}"), clock=FakeClock())
    torch.set_num_threads(threads)
    (root / "truncated").mkdir()
    ckpt = (root / "run" / "ckpt.pt").read_bytes()
    (root / "truncated" / "ckpt.pt").write_bytes(ckpt[:len(ckpt) // 2])
    (root / "hostile").mkdir()
    torch.save({"model": RunsCode(root / "marker"), "model_config": {}, "meta": {}}, root / "hostile" / "ckpt.pt")
    return root, data


# case: (command, arguments, the fix its one-line message must name); {root} is the fixture's folder, in both
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
    "negative muon_lr": ("train.py", "train.muon_lr=-0.02", "train.muon_lr=-0.02 must be positive"),
    "min_lr above the peak": ("train.py", "train.min_lr=0.1", "is above train.learning_rate=0.002"),
    "beta2 of 1": ("train.py", "train.beta2=1", "train.beta2=1.0 must be in [0, 1)"),
    "negative weight decay": ("train.py", "train.weight_decay=-0.1", "train.weight_decay=-0.1 must be >= 0"),
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
                                  "(saved vs now): model.n_layer=2 vs 3; drop those overrides to resume"),
    "resume with another optimizer": ("train.py", "out_dir={root}/run train.resume=true train.optimizer=adamw",
                                      "train.optimizer='muon' vs 'adamw'; drop those overrides to resume"),
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
    "evaluate: unknown key": ("-m scripts.evaluate", "out_dir={root}/run txt=x",
                              "Key 'txt' not in 'EvalConfig'; python -m scripts.evaluate --help"),
    "evaluate: characters outside the vocabulary": ("-m scripts.evaluate", "out_dir={root}/run text={root}/accents.txt",
                                                    "the model's vocabulary lacks: 'é', '€'; remove them"),
    "evaluate: empty text": ("-m scripts.evaluate", "out_dir={root}/run text={root}/empty.txt",
                             "holds 0 token(s) but scoring needs 2 or more"),
    "evaluate: missing text": ("-m scripts.evaluate", "out_dir={root}/run text={root}/missing.txt",
                               "missing.txt does not exist; pass text=FILE"),
    "export: missing out_dir": ("-m scripts.export", "out_dir={root}/nowhere",
                                "error: no checkpoint in {root}/nowhere; train one with"),
    "prepare: unknown key": ("-m data.prepare", "data.pth=x", "Key 'pth' not in 'DataConfig'; python train.py --help"),
    "prepare: missing corpus": ("-m data.prepare", "data=text data.path={root}/missing.txt",
                                "does not exist; pass data.path=FILE"),
}
# one case per command in a real process too: its exit status and all it writes to stderr (a stray warning, a
# traceback from teardown), the command line's own sys.argv and help_script
IN_A_PROCESS = ["unknown key", "sample a checkpoint that runs code", "evaluate: unknown key", "prepare: unknown key"]
# the argparse commands' numbers: a usage line naming the bound, exit status 2
ARGPARSE_CASES = {"report --threads -1": ("scripts.report", "--threads", "-1", "--threads: -1 is below 0"),
                  "report --jobs 0": ("scripts.report", "--jobs", "0", "--jobs: 0 is below 1"),
                  "bench --deadline-s -5": ("scripts.bench", "--deadline-s", "-5", "--deadline-s: -5 is below 0"),
                  "gpu --deadline-s nan": ("scripts.report.gpu", "--deadline-s", "nan", "--deadline-s: nan is below 0")}


def arguments(case, root, data):
    command, args, _ = CASES[case]
    args = [a.format(root=root) for a in args.split(" ")]
    if command == "train.py":
        args = [*TINY, *data, f"out_dir={root / case.replace(' ', '-')}", *args]
    return command, args


def check(case, root, code, stdout, stderr):
    fix = CASES[case][2].format(root=root)
    assert code == 2 and stderr.startswith("error: ") and len(stderr.strip().splitlines()) == 1, \
        f"{case}: exit status {code}\n{stderr[-2000:]}"
    assert fix in stderr and "Traceback" not in stdout + stderr, f"{case}: {stderr[-2000:]}"


@pytest.mark.parametrize("case", CASES)
def test_a_mistake_ends_in_one_line_naming_the_fix(case, files, one_thread):
    root, data = files
    command, args = arguments(case, root, data)
    check(case, root, *run_in_process(command, *args))
    assert not (root / "marker").exists()


@pytest.mark.slow
def test_a_mistake_through_each_real_command_line(files):
    root, data = files

    def run(case):
        command, args = arguments(case, root, data)
        return run_script(*command.split(), *args, timeout=300)

    with ThreadPoolExecutor(2) as pool:  # each case is a fresh python process, mostly importing torch
        for case, result in zip(IN_A_PROCESS, pool.map(run, IN_A_PROCESS)):
            check(case, root, result.returncode, result.stdout, result.stderr)
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


@pytest.mark.parametrize("case", ARGPARSE_CASES)
def test_a_secondary_commands_number_out_of_range_is_its_usage_error(case, monkeypatch, capsys):
    import importlib
    module, *args, fix = ARGPARSE_CASES[case]
    main = importlib.import_module(module if module != "scripts.report" else "scripts.report.__main__").main
    monkeypatch.setattr("sys.argv", [module, *args])
    with pytest.raises(SystemExit) as stopped:
        main()
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and fix in err.splitlines()[-1] and "Traceback" not in err
