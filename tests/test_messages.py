"""One line that names the fix for mistakes outside the config schema: a sweep plugin that is not installed, Slurm's
launcher where no Slurm is, an RNN run exported as GPT-2, GPT-2's tokenizer offline under sample.py's key."""

import pytest
from hydra.errors import MissingConfigException

import data.tokenizers as tokenizers
from attnlab.checkpoint import build_model
from attnlab.cli import hydra_error_line, run_cli
from attnlab.config import ModelConfig
from attnlab.hf import to_hf


@pytest.mark.parametrize("missing", ["hydra/sweeper/optuna", "hydra/launcher/slurm"])
def test_a_missing_sweep_plugin_names_the_extra(missing):
    line = hydra_error_line(MissingConfigException(f"Could not find '{missing}'", missing), "train.py")
    assert line == f"Could not find '{missing}': Hydra's sweep plugins are not installed; pip install -e '.[sweeps]'"


def test_slurm_without_slurm_is_one_line(monkeypatch, capsys):
    def launch():
        raise RuntimeError('Could not detect "srun", are you indeed on a slurm cluster?')

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit:
        run_cli(launch)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 2 and len(err) == 1
    assert err[0].startswith("error: hydra/launcher=slurm found no Slurm here (Could not detect \"srun\"")
    assert err[0].endswith("or pass hydra/launcher=submitit_local to run its jobs on this machine")


def test_other_runtime_errors_keep_their_traceback(monkeypatch):
    def launch():
        raise RuntimeError("a bug")

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(RuntimeError, match="a bug"):
        run_cli(launch)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_exporting_an_rnn_run_says_only_a_gpt_exports(tmp_path, kind):
    model = build_model(ModelConfig(type=kind, n_layer=1, n_embd=8, vocab_size=10))
    with pytest.raises(ValueError, match=f"^this run's model.type is {kind}, not gpt; only a GPT trained with "
                                         "model=gpt2 exports"):
        to_hf(model, tmp_path / "hf")


def test_gpt2_tokenizer_offline_names_the_key_of_the_command(monkeypatch):
    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tokenizers.tiktoken, "get_encoding", offline)
    with pytest.raises(ValueError, match=r"pass bpe_file=PATH to a gpt2.tiktoken file$"):
        tokenizers.GPT2Tokenizer(None, option="bpe_file")
    with pytest.raises(ValueError, match=r"pass data.bpe_file=PATH to a gpt2.tiktoken file$"):
        tokenizers.GPT2Tokenizer(None)
