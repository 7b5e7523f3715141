"""Checkpoints: plain data written atomically, loaded with weights_only=True, and the model rebuilt from one.

What a checkpoint holds is TrainingState's to say: its fields, and what save() writes beside them (the model config,
the whole run config, the corpus's meta.json, the RNG states); FORMAT numbers that layout. train.py writes them;
sample.py, scripts/export.py and scripts/report read them. Whether a run may resume from one is decided here too
(checkpoint_to_resume, check_resumable); what a resumed run's config may change is config.py's (resume_config).
"""
import math
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from attnlab.config import Config, ModelConfig
from attnlab.distributed import full_state_dicts, load_full_state_dicts
from attnlab.rnn import RNN
from model import GPT

FORMAT = 1  # TrainingState.save's layout; files from before the number existed (format 0) hold the same keys


@dataclass
class TrainingState:
    """What a checkpoint holds that training changes; it saves and loads as one. save() writes these fields with the
    model config, the whole run config, the corpus's meta.json and the RNG states beside them."""
    model: torch.nn.Module  # uncompiled, not DDP-wrapped (under FSDP, sharded in place), so its names are plain
    optimizer: object
    iter: int = 0
    best_val_loss: float = math.inf
    elapsed_s: float = 0.0  # seconds trained, a resumed run's earlier ones included
    skipped_steps: int = 0  # steps skipped for a non-finite loss (train.skip_nonfinite)
    wandb_id: str | None = None  # the wandb run this training run logs to, so that a resumed run continues it

    def save(self, path, cfg, meta, master=True):
        """Every process calls it (under FSDP each holds a shard of the state, gathered here); master writes."""
        model_state, optimizer_state = full_state_dicts(self.model, self.optimizer)
        if not master:
            return
        device = next(self.model.parameters()).device
        save_checkpoint(path, {
            "model": model_state, "optimizer": optimizer_state,
            "model_config": asdict(cfg.model), "config": asdict(cfg), "meta": meta, "iter": self.iter,
            "best_val_loss": self.best_val_loss, "elapsed_s": self.elapsed_s, "skipped_steps": self.skipped_steps,
            "wandb_id": self.wandb_id, "rng": {"torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}})

    def load(self, ckpt):
        load_full_state_dicts(self.model, self.optimizer, ckpt["model"], ckpt["optimizer"])
        self.iter = ckpt["iter"]
        self.best_val_loss = ckpt["best_val_loss"]
        self.elapsed_s = ckpt["elapsed_s"]
        self.skipped_steps = ckpt.get("skipped_steps", 0)
        self.wandb_id = ckpt.get("wandb_id")
        torch.set_rng_state(ckpt["rng"]["torch"])
        device = next(self.model.parameters()).device
        if device.type == "cuda" and ckpt["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)


def build_model(model_cfg: ModelConfig | dict):
    """A freshly initialised GPT or RNN for model_cfg (a ModelConfig, or its dict as a checkpoint holds it)."""
    model_cfg = ModelConfig(**model_cfg) if isinstance(model_cfg, dict) else model_cfg
    architecture = model_cfg.architecture()
    return GPT(architecture) if model_cfg.type == "gpt" else RNN(architecture)


def save_checkpoint(path, state):
    """Write to a temporary file, then rename: a crash leaves the old checkpoint or the new, never a torn one. A
    failed write (a full disk, say) removes the temporary file and raises OSError in one line."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save({**state, "format": FORMAT}, f)
            os.fsync(f.fileno())  # on disk before the rename, so a power cut cannot leave the new name on a torn file
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError without errno
        free = shutil.disk_usage(path.parent).free if path.parent.exists() else None
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.strerror:
            why = e.strerror
        elif free is not None and free < 2 ** 20:
            why = f"the disk is full: {free:,} bytes were left"
        else:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
        kept = f"the previous {path.name} is intact" if path.exists() else f"no earlier {path.name} exists"
        then = "continue with train.resume=true" if (path.parent / "ckpt.pt").exists() else "run the same command again"
        raise OSError(f"could not write checkpoint {path} ({why}); {kept}; free some space, then {then}") from None


def load_checkpoint(path):
    """A checkpoint is plain data, so it loads with weights_only=True: a file that would run code is refused."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file, or one that only an unsafe unpickler would read
        code = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        why = (f"it holds a Python object ({code[1]}) that would run code when loaded, which is refused" if code
               else "it is truncated or not a checkpoint")
        raise ValueError(f"cannot load checkpoint {path}: {why}; delete it or pick another out_dir") from None
    if not isinstance(ckpt, dict) or not {"model", "model_config", "meta"} <= ckpt.keys():
        raise ValueError(f"{path} is not a checkpoint written by train.py; delete it or pick another out_dir")
    if ckpt.get("format", 0) > FORMAT:
        raise ValueError(f"{path} has checkpoint format {ckpt['format']}, newer than this code's {FORMAT}; update "
                         f"attnlab (git pull) to read it")
    return ckpt


def check_same_model(saved: dict, current: ModelConfig, out_dir):
    """Refuse to load weights into a model of another shape, naming every field that differs. A field the saved
    config lacks is newer than the file, which was trained with that field's default (window=0: full attention)."""
    saved = {**asdict(ModelConfig()), **saved}
    differ = [f"{k}={saved[k]!r} vs {v!r}" for k, v in asdict(current).items() if saved[k] != v]
    if differ:
        raise ValueError(f"checkpoint in {out_dir} was trained with another model (saved vs now): "
                         f"{', '.join(differ)}; drop those overrides or use a new out_dir")


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
    saved = saved_config(ckpt).get("train", {}).get("optimizer", cfg.train.optimizer)
    if saved != cfg.train.optimizer:
        raise ValueError(f"checkpoint in {cfg.out_dir} was trained with train.optimizer={saved}, not "
                         f"{cfg.train.optimizer}; resume with train.optimizer={saved}")


def saved_model_config(ckpt) -> ModelConfig:
    """The model a checkpoint was trained with."""
    return ModelConfig(**ckpt["model_config"])


def saved_config(ckpt) -> dict:
    """The whole run config a checkpoint was trained with, as a dict ({} in files older than that record)."""
    return ckpt.get("config", {})


def load_model(out_dir, which="best", device="cpu"):
    """The model of a training run in eval mode, and its corpus's meta (the tokenizer): best.pt (lowest val loss,
    else the latest) or latest (ckpt.pt)."""
    if which not in ("best", "latest"):
        raise ValueError(f"checkpoint={which!r} is unknown; use best or latest")
    out_dir = Path(out_dir)
    candidates = [out_dir / "best.pt", out_dir / "ckpt.pt"] if which == "best" else [out_dir / "ckpt.pt"]
    path = next((p for p in candidates if p.exists()), None)
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {out_dir}; train one with: python train.py out_dir={out_dir}")
    ckpt = load_checkpoint(path)
    model = build_model(ckpt["model_config"])
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), ckpt["meta"]
