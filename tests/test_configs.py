"""Every preset in configs/ composes onto the typed schema and validates; mistakes fail at start-up."""
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
