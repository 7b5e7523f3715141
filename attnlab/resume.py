"""Resuming a run: its saved config plus only what the command line says now, checked against what a run cannot
change mid-way, from its checkpoint read once.

    python train.py train.resume=true out_dir=out/mini                        # continue exactly where it stopped
    python train.py train.resume=true out_dir=out/mini train.max_iters=2000   # ... and train longer

train.py's main() reads the checkpoint (for the config) and hands it to train(), which checks the corpus and the
model against it and loads it; train(cfg) called with train.resume=true reads it itself.
"""
import os
from dataclasses import asdict
from pathlib import Path

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from attnlab.checkpoint import check_same_model, load_checkpoint
from attnlab.config import CONFIG_DIR, Config, flatten

# keys a resumed run cannot change: the model's shape and kind, the corpus's tokens, the optimizer's state
FROZEN_ON_RESUME = ("model.", "data.name", "data.tokenizer", "data.bpe_vocab_size", "data.text_field",
                    "data.val_fraction", "train.optimizer", "train.init_from")


def checkpoint_to_resume(cfg: Config, ckpt=None):
    """The checkpoint a run continues (ckpt where the caller read it already), None for a fresh run; refuses to start
    afresh over a checkpoint."""
    path = Path(cfg.out_dir) / "ckpt.pt"
    if path.exists() and not cfg.train.resume:
        raise ValueError(f"{cfg.out_dir} already holds a checkpoint; pass train.resume=true to continue it, or a new "
                         f"out_dir=... (nothing is overwritten)")
    if not cfg.train.resume:
        return None
    if not path.exists():
        raise FileNotFoundError(f"train.resume=true but {path} does not exist; train without resume first")
    return ckpt if ckpt is not None else load_checkpoint(path)


def check_resumable(ckpt, cfg: Config, meta):
    """Refuse a checkpoint that cannot continue as cfg (its model resolved) on the corpus of meta: another tokenizer,
    another model, another optimizer."""
    if ckpt["meta"]["tokenizer"] != meta["tokenizer"]:  # checked first: it explains a vocab_size mismatch
        raise ValueError(f"checkpoint in {cfg.out_dir} used another tokenizer or vocabulary than data="
                         f"{cfg.data.name}; resume with the run's original data settings")
    check_same_model(ckpt["model_config"], cfg.model, cfg.out_dir)
    saved = ckpt.get("config", {}).get("train", {}).get("optimizer", cfg.train.optimizer)
    if saved != cfg.train.optimizer:
        raise ValueError(f"checkpoint in {cfg.out_dir} was trained with train.optimizer={saved}, not "
                         f"{cfg.train.optimizer}; resume with train.optimizer={saved}")


def resumed_config(dict_cfg, ckpt, overrides) -> Config:
    """The config a resumed run continues with: ckpt's, plus the keys this command line (overrides, dict_cfg its
    composition) gives; says what changed."""
    asked = OmegaConf.to_container(dict_cfg, resolve=True)
    cfg, changed = resume_config(ckpt.get("config", {}), asked, keys_given(overrides, dict_cfg))
    if changed and int(os.environ.get("RANK", "0")) == 0:
        changes = ", ".join(f"{key}={new!r} (was {old!r})" for key, (old, new) in changed.items())
        print(f"resuming {cfg.out_dir} with {changes}")
    return cfg


def keys_given(overrides, dict_cfg):
    """The config keys a command line sets: each key=value, and each key that a preset chosen with group=option
    changes (against the same command line without the presets)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    keys = {o.key_or_group for o in parsed if not o.key_or_group.startswith("hydra") and not o.is_delete()}
    groups = {key for key in keys if (CONFIG_DIR / key).is_dir()}
    if not groups:
        return keys
    plain = [text for text, o in zip(overrides, parsed) if o.key_or_group not in groups]
    without = flatten(OmegaConf.to_container(hydra.compose(config_name="config", overrides=plain), resolve=True))
    asked = flatten(OmegaConf.to_container(dict_cfg, resolve=True))
    return (keys - groups) | {key for key, value in asked.items() if without.get(key) != value}


def resume_config(saved: dict, asked: dict, given: set[str]) -> tuple[Config, dict]:
    """What a resumed run continues with: its saved config (a key it lacks takes today's default; one today's schema
    lacks is dropped), plus the keys given on the command line now. A given key that cannot change mid-run and differs
    is refused, naming each one with its saved and asked value. Returns the config and {key: (saved, now)} for every
    key that changed."""
    saved_flat = {**flatten(asdict(Config())), **flatten(saved)}
    asked_flat = flatten(asked)
    values = {key: saved_flat[key] for key in asked_flat}
    values["out_dir"] = asked_flat["out_dir"]
    values["train.resume"] = True
    changed = {key: (values[key], asked_flat[key]) for key in sorted(given & asked_flat.keys())
               if asked_flat[key] != values[key] and key not in ("out_dir", "train.resume")}
    frozen = [f"{key}={old!r} vs {new!r}" for key, (old, new) in changed.items() if key.startswith(FROZEN_ON_RESUME)]
    if frozen:
        raise ValueError(f"{values['out_dir']} was trained with other values of keys a run cannot change mid-way "
                         f"(saved vs now): {', '.join(frozen)}; drop those overrides to resume, or train anew in "
                         f"another out_dir")
    values.update({key: new for key, (_, new) in changed.items()})
    merged = OmegaConf.merge(OmegaConf.structured(Config), nested(values))
    return OmegaConf.to_object(merged), changed


def nested(flat_dict):
    """{"model.n_layer": 2} as {"model": {"n_layer": 2}}: flatten undone."""
    out = {}
    for key, value in flat_dict.items():
        *groups, name = key.split(".")
        node = out
        for group in groups:
            node = node.setdefault(group, {})
        node[name] = value
    return out
