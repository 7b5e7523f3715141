"""Every preset in configs/ composes onto the typed schema and validates; mistakes fail at start-up, as a ValueError
that names the fix, for any numbers in any field (hypothesis)."""
import re
from dataclasses import fields
from pathlib import Path

import hydra
import pytest
from hydra.core.config_store import ConfigStore
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from attnlab.config import (
    CONFIG_DIR,
    MODEL_TYPES,
    Config,
    DataConfig,
    EvalConfig,
    HellaSwagConfig,
    LoggerConfig,
    ModelConfig,
    SampleConfig,
    TrainConfig,
    compose,
    register_configs,
)
from attnlab.hf import GPT2_ARCH, gpt2_config_problems
from attnlab.rnn import RNNConfig
from model import GPTConfig

PRESETS = [f"{p.parent.name}={p.stem}" for p in sorted(CONFIG_DIR.glob("*/*.yaml"))]
HYDRA_GROUPS = Path(hydra.__file__).parent / "conf" / "hydra"  # hydra/job_logging, hydra/hydra_logging, ...


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_and_validates(preset):
    if preset.startswith("hparams_search="):  # Optuna's sweeper: the optional extra sweeps
        pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    assert isinstance(compose(preset), Config)


def test_defaults_and_sample_config():
    cfg = compose()
    assert cfg.data.name == "stdlib" and cfg.model.pos == "rope" and cfg.model.attn == "sdpa"
    assert isinstance(compose("prompt=hi", "num_samples=2", config_name="sample"), SampleConfig)


@pytest.mark.parametrize("override, error", [
    ("model.n_layers=4", "n_layers"),  # a misspelt key
    ("train.batch_size=many", "batch_size"),  # a value of the wrong type
    ("model.n_embd=130", "not divisible by n_head"),  # caught by GPTConfig.__post_init__
])
def test_mistakes_fail_at_start_up(override, error):
    with pytest.raises(Exception, match=error):
        compose(override)


def test_zero_heads_is_a_value_error_not_a_division_by_zero():
    with pytest.raises(ValueError, match="n_head=0 must be positive"):
        compose("model.n_head=0")


def test_bad_data_and_sample_values_fail_at_construction():
    with pytest.raises(ValueError, match="data.name='wiki' is unknown"):
        DataConfig(name="wiki")
    with pytest.raises(ValueError, match="num_samples=0 must be >= 1"):
        SampleConfig(num_samples=0)


# arbitrary integers, small ones (where the valid values are) most often; a float field may also get a fraction
INTS = st.one_of(st.integers(-2, 16), st.integers())
FLOATS = st.one_of(INTS, st.floats(-2.0, 2.0))
NUMBERS = {int: INTS, float: FLOATS, int | None: st.none() | INTS, float | None: st.none() | FLOATS}


# (schema, fixed arguments): ModelConfig once for each model type
CASES = [(GPTConfig, {}), (RNNConfig, {"type": "lstm", "tie_weights": False}),
         *[(ModelConfig, {"type": t}) for t in MODEL_TYPES], (TrainConfig, {}), (EvalConfig, {}),
         (DataConfig, {}), (LoggerConfig, {}), (SampleConfig, {}), (HellaSwagConfig, {})]


@pytest.mark.parametrize("schema, fixed", CASES, ids=[s.__name__ + "".join(f"-{v}" for v in f.values())
                                                       for s, f in CASES])
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_numbers_construct_or_raise_a_value_error(schema, fixed, data):
    """The class of the old `n_head=0` bug: a ZeroDivisionError from a check that divided before it checked."""
    numeric = {f.name: NUMBERS[f.type] for f in fields(schema) if f.type in NUMBERS}
    if schema in (GPTConfig, ModelConfig):
        assert {"n_head", "n_kv_head", "n_embd"} <= numeric.keys()
    values = data.draw(st.fixed_dictionaries(numeric))
    try:
        schema(**fixed, **values)
    except ValueError as e:
        assert str(e) and "\n" not in str(e)


@pytest.mark.parametrize("root", ["config", "sample", "evaluate", "hellaswag"])
def test_every_default_names_a_schema_or_an_existing_group(root):
    register_configs()
    schemas = {name.removesuffix(".yaml") for name in ConfigStore.instance().list("")}
    defaults = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / f"{root}.yaml"))["defaults"]
    for entry in defaults:
        if isinstance(entry, str):
            assert entry == "_self_" or entry in schemas, entry
            continue
        ((key, option),) = entry.items()
        group = key.removeprefix("override ")
        if group.startswith("hydra/"):
            assert (HYDRA_GROUPS / group.removeprefix("hydra/") / f"{option}.yaml").exists(), entry
            continue
        # a group without a single preset (the old `train: null`) would only be a name to mistype
        assert list((CONFIG_DIR / group).glob("*.yaml")), f"configs/{group}/ has no presets"
        assert option is None or (CONFIG_DIR / group / f"{option}.yaml").exists(), entry


def test_gpt2_preset_is_what_hf_converts():
    model = compose("model=gpt2").model
    assert {key: getattr(model, key) for key in GPT2_ARCH} == GPT2_ARCH
    preset = (CONFIG_DIR / "model" / "gpt2.yaml").read_text()
    assert all(f"\n{key}: " in preset for key in GPT2_ARCH)  # set there, not left to defaults that may change
    assert gpt2_config_problems(model) == []
    assert (model.n_layer, model.n_head, model.n_embd, model.block_size, model.vocab_size) == (12, 12, 768, 1024,
                                                                                               50257)


def test_speed_experiments_compose_with_their_recipes():
    speedrun = compose("experiment=speedrun_cpu")
    assert speedrun.data.name == "shakespeare_char" and speedrun.train.optimizer == "muon"
    assert speedrun.train.final_eval == "full" and speedrun.model.pos == "rope"
    assert speedrun.model.ngram >= 2  # its hashed n-gram embeddings, which the long recipe inherits
    nanogpt = compose("experiment=nanogpt_cpu", "train.final_eval=full")
    assert (nanogpt.model.n_layer, nanogpt.model.n_embd, nanogpt.model.block_size, nanogpt.train.batch_size,
            nanogpt.train.max_iters, nanogpt.model.pos, nanogpt.train.optimizer) == (4, 128, 64, 12, 2000, "learned",
                                                                                 "adamw")
    # the short speedrun keeps nanoGPT's width, context and batch size with a layer fewer; the long one inherits its
    # levers, not its shape
    assert ((speedrun.model.n_layer, speedrun.model.n_embd, speedrun.model.block_size, speedrun.train.batch_size)
            == (3, 128, 64, 12))
    long = compose("experiment=speedrun_cpu_long")
    assert (long.model.n_layer, long.model.block_size, long.train.batch_size) == (3, 128, 24)
    # a step count, which repeats on any machine; scripts/bench.py gives it nanoGPT's wall there as a budget instead
    assert long.train.time_budget_s == 0 and long.train.max_iters == 640
    assert (long.train.optimizer, long.model.norm, long.model.qk_norm, long.model.ngram, long.train.muon_momentum,
            long.train.final_eval) == ("muon", "rmsnorm", True, speedrun.model.ngram, speedrun.train.muon_momentum,
                                       "full")


def test_every_preset_the_readme_names_exists():
    readme = (CONFIG_DIR.parent / "README.md").read_text()
    named = set(re.findall(r"\b(model|data|experiment|logger)=(\w+)", readme))
    assert named and all((CONFIG_DIR / group / f"{name}.yaml").exists() for group, name in named), sorted(named)
