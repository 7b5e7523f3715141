"""Every preset in configs/ composes onto the typed schema and validates; mistakes fail at start-up."""
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from config import Config, SampleConfig, register_configs

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
PRESETS = [f"{p.parent.name}={p.stem}" for p in sorted(CONFIGS.glob("*/*.yaml"))]
register_configs()


def compose_config(name, overrides):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name=name, overrides=overrides))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_and_validates(preset):
    cfg = compose_config("config", [preset])
    assert isinstance(cfg, Config)


def test_defaults_and_sample_config():
    cfg = compose_config("config", [])
    assert cfg.data.name == "stdlib" and cfg.model.pos == "rope" and cfg.model.attn == "sdpa"
    assert isinstance(compose_config("sample", ["prompt=hi", "num_samples=2"]), SampleConfig)


@pytest.mark.parametrize("override, error", [
    ("model.n_layers=4", "n_layers"),  # a misspelt key
    ("train.batch_size=many", "batch_size"),  # a value of the wrong type
    ("model.n_embd=130", "not divisible by n_head"),  # caught by GPTConfig.__post_init__
])
def test_mistakes_fail_at_start_up(override, error):
    with pytest.raises(Exception, match=error):
        compose_config("config", [override])


def test_speed_experiments_compose_with_their_recipes():
    speedrun = compose_config("config", ["experiment=speedrun_cpu"])
    assert speedrun.data.name == "shakespeare_char" and speedrun.train.optimizer == "muon"
    assert speedrun.train.final_eval == "full" and speedrun.model.pos == "rope"
    nanogpt = compose_config("config", ["experiment=nanogpt_cpu", "train.final_eval=full"])
    assert (nanogpt.model.n_layer, nanogpt.model.n_embd, nanogpt.model.block_size, nanogpt.train.batch_size,
            nanogpt.train.max_iters, nanogpt.model.pos, nanogpt.train.optimizer) == (4, 128, 64, 12, 2000, "learned",
                                                                                 "adamw")
    # the short speedrun keeps nanoGPT's model and batch size; the long one inherits its levers, not its shape
    assert ((speedrun.model.n_layer, speedrun.model.n_embd, speedrun.model.block_size, speedrun.train.batch_size)
            == (4, 128, 64, 12))
    long = compose_config("config", ["experiment=speedrun_cpu_long"])
    assert (long.model.n_layer, long.model.block_size, long.train.batch_size) == (3, 128, 24)
    assert long.train.time_budget_s == 80 and long.train.max_iters > 1000  # the budget ends it, not the step count
    assert (long.train.optimizer, long.model.norm, long.model.qk_norm, long.train.muon_momentum,
            long.train.final_eval) == ("muon", "rmsnorm", True, speedrun.train.muon_momentum, "full")


def test_every_preset_the_readme_names_exists():
    readme = (CONFIGS.parent / "README.md").read_text()
    named = set(re.findall(r"\b(model|data|experiment|logger)=(\w+)", readme))
    assert named and all((CONFIGS / group / f"{name}.yaml").exists() for group, name in named), sorted(named)
