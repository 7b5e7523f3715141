"""Train a GPT on a text corpus.

    python train.py                                     # built-in corpus (Python's stdlib), a few CPU minutes
    python train.py experiment=shakespeare_char         # a recipe from configs/experiment/
    python train.py model.n_layer=4 train.max_iters=500 out_dir=out/mini
    python train.py train.resume=true out_dir=out/mini  # continue exactly where a run stopped
    torchrun --standalone --nproc_per_node=2 train.py   # DDP: one process per device

Every option and its default is in config.py; configs/ holds named presets. `train(cfg)` is the whole story.
"""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path

import hydra
import numpy as np
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from config import Config, ModelConfig, register_configs, run_cli
from data.prepare import load_meta, load_split, prepare
from model import GPT
from rnn import RNN

register_configs()


def pick_device(name):
    if name != "auto":
        try:
            device = torch.device(name)
        except RuntimeError:
            raise ValueError(f"device {name!r} is unknown; use auto, cpu, cuda, cuda:N or mps") from None
        if (device.type == "cuda" and not torch.cuda.is_available()
                or device.type == "mps" and not torch.backends.mps.is_available()):
            raise ValueError(f"device {name!r} is not available on this machine; use auto or cpu")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def autocast_dtype(device, name):
    """The dtype to autocast to, or None for plain fp32. auto: bf16 on CUDA where supported."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    return None if name == "float32" else getattr(torch, name)


# Dense (no sparsity) bf16 peak FLOP/s of common GPUs, from the vendor datasheets; the first name contained in
# torch.cuda.get_device_name() wins. MFU is the model's FLOPs per second over this (PaLM, Chowdhery et al. 2022).
PEAK_FLOPS = [("H100 NVL", 835e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("B200", 2250e12),
              ("A100", 312e12), ("L40S", 362e12), ("L4", 121e12)]


def peak_flops(device):
    """The device's bf16 peak in FLOP/s, or None where it is not in PEAK_FLOPS (every CPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_FLOPS if key in name), None)


def build_model(model_cfg):
    if model_cfg.type == "gpt":
        return GPT(model_cfg)
    if model_cfg.type in ("lstm", "gru"):
        return RNN(model_cfg)
    raise ValueError(f"model.type={model_cfg.type!r} is unknown; use gpt, lstm or gru")


def load_pretrained(cfg, meta):
    """GPT-2's weights (through transformers) as a model config and a state dict, cropped to model.block_size."""
    from export import from_hf
    gpt2 = from_hf(cfg.train.init_from)
    if meta["tokenizer"]["type"] != "gpt2":
        raise ValueError(f"init_from={cfg.train.init_from} reads GPT-2 tokens; add data.tokenizer=gpt2")
    if meta["vocab_size"] > gpt2.config.vocab_size:
        raise ValueError(f"the corpus's tokenizer has {meta['vocab_size']} tokens, {cfg.train.init_from} only "
                         f"{gpt2.config.vocab_size}; use data.tokenizer=gpt2 with GPT-2's own ranks file")
    if cfg.model.block_size > gpt2.config.block_size:
        raise ValueError(f"model.block_size={cfg.model.block_size} is longer than {cfg.train.init_from}'s "
                         f"{gpt2.config.block_size} positions; pass a smaller model.block_size")
    model_cfg = ModelConfig(**{**asdict(gpt2.config), "block_size": cfg.model.block_size,
                               "dropout": cfg.model.dropout})
    state = gpt2.state_dict()
    state["transformer.wpe.weight"] = state["transformer.wpe.weight"][:cfg.model.block_size]
    return model_cfg, state


def get_batch(data, batch_size, block_size, generator, device):
    """batch_size random windows of data: inputs x (B, T) and targets y = x shifted left by one."""
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator).numpy()
    rows = data[starts[:, None] + np.arange(block_size + 1)]  # (B, T + 1), one gather from the memmap
    batch = torch.from_numpy(rows.astype(np.int64))
    x, y = batch[:, :-1], batch[:, 1:]
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


@torch.no_grad()
def estimate_loss(model, splits, cfg, device, autocast, full_val=False):
    """Mean loss over eval_iters batches per split; the same batches every time, so estimates compare.
    With full_val, the val split's loss is over all of its tokens instead (full_loss)."""
    model.eval()
    losses = {}
    for name, data in splits.items():
        if full_val and name == "val":
            losses[name] = full_loss(model, data, cfg.train.batch_size, cfg.model.block_size, device, autocast)
            continue
        generator = torch.Generator().manual_seed(cfg.train.seed)
        total = 0.0
        for _ in range(cfg.train.eval_iters):
            x, y = get_batch(data, cfg.train.batch_size, cfg.model.block_size, generator, device)
            with autocast:
                total += model(x, y)[1].item()
        losses[name] = total / cfg.train.eval_iters
    model.train()
    return losses


@torch.no_grad()
def full_loss(model, data, batch_size, block_size, device, autocast):
    """Mean loss over every token of data: consecutive non-overlapping blocks (the last one shorter), each token
    predicted once from the tokens before it in its block, as in training."""
    ids = torch.from_numpy(data.astype(np.int64))
    n_blocks = (len(ids) - 1) // block_size
    blocks = ids[:n_blocks * block_size + 1].unfold(0, block_size + 1, block_size)  # (n_blocks, T + 1)
    batches = list(blocks.split(batch_size)) + [ids[n_blocks * block_size:][None]]  # the tail, (1, < T + 1)
    total = 0.0
    for batch in batches:
        if batch.size(1) < 2:
            continue
        with autocast:
            loss = model(batch[:, :-1].to(device), batch[:, 1:].to(device))[1]
        total += loss.item() * batch[:, 1:].numel()
    return total / (len(ids) - 1)


def get_lr(it, cfg, seconds=0.0):
    """Linear warmup to learning_rate, then cosine decay to min_lr at max_iters, or with a time budget at
    time_budget_s seconds of training, whichever comes first."""
    t = cfg.train
    if it < t.warmup_iters:
        return t.learning_rate * (it + 1) / t.warmup_iters
    progress = (it - t.warmup_iters) / max(1, t.max_iters - t.warmup_iters)
    if t.time_budget_s > 0:
        progress = max(progress, seconds / t.time_budget_s)
    return t.min_lr + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (t.learning_rate - t.min_lr)


def make_optimizer(model, cfg, device):
    """AdamW with weight decay on matrices only (not on norms, biases or vectors). With optimizer=muon the blocks'
    matrices take Muon instead, orthogonalised momentum (Jordan et al. 2024, "Muon: An optimizer for hidden layers");
    embeddings, the head and the gains stay on AdamW, as Muon's authors advise."""
    t = cfg.train
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def on_muon(name, p):  # a matrix inside a block
        return t.optimizer == "muon" and p.dim() == 2 and name.startswith("transformer.h.")

    hidden, params = [p for n, p in named if on_muon(n, p)], [p for n, p in named if not on_muon(n, p)]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    adamw = torch.optim.AdamW(groups, lr=t.learning_rate, betas=(t.beta1, t.beta2), fused=device.type == "cuda")
    if not hidden:
        return adamw
    # lr_scale: the loop sets each group's lr to the scheduled lr times this
    muon = torch.optim.Muon([{"params": hidden, "lr_scale": t.muon_lr / t.learning_rate}], lr=t.muon_lr,
                            momentum=t.muon_momentum, weight_decay=t.weight_decay)
    return Optimizers(adamw, muon)


class Optimizers:
    """Several optimizers that step, zero and checkpoint as one, so the loop and GradScaler see a single one."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers

    @property
    def param_groups(self):  # read afresh: load_state_dict replaces each optimizer's group dicts
        return [g for o in self.optimizers for g in o.param_groups]

    def step(self):
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return [o.state_dict() for o in self.optimizers]

    def load_state_dict(self, states):
        for o, state in zip(self.optimizers, states, strict=True):
            o.load_state_dict(state)


def save_checkpoint(path, state):
    """Write to a temporary file, then rename: a crash leaves the old checkpoint or the new, never a torn one."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        os.fsync(f.fileno())  # on disk before the rename, so a power cut cannot leave the new name on a torn file
    os.replace(tmp, path)


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
    return ckpt


def check_same_model(saved, current, out_dir):
    differ = [f"{k}={saved.get(k)!r} vs {v!r}" for k, v in current.items() if saved.get(k) != v]
    if differ:
        raise ValueError(f"checkpoint in {out_dir} was trained with another model (saved vs now): "
                         f"{', '.join(differ)}; drop those overrides or use a new out_dir")


def trim_metrics(path, last_iter):
    """Keep the lines logged up to last_iter: what a killed run logged after its checkpoint goes, and so does a line
    a power cut tore. Rewritten through a temporary file like checkpoints, so a crash here loses nothing either."""
    lines = path.read_text().splitlines()
    kept = [line for line in lines if line.endswith("}") and json.loads(line)["iter"] <= last_iter]  # flat rows
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except OSError:
        return None


def plot_losses(out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    logs, evals = [r for r in rows if r["event"] == "log"], [r for r in rows if r["event"] == "eval"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["iter"] for r in logs], [r["train_loss"] for r in logs], lw=0.8, alpha=0.6, label="train (batch)")
    ax.plot([r["iter"] for r in evals], [r["val_loss"] for r in evals], "o-", label="val")
    ax.set(xlabel="iteration", ylabel="loss (nats/token)", title=out_dir.name)
    ax.legend()
    fig.savefig(out_dir / "loss.png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def train(cfg: Config):
    """Train as cfg says; returns a summary of the run. Raises ValueError for a config or data mistake."""
    # ---- setup: processes, device, seeds ----
    distributed = "RANK" in os.environ
    rank, local_rank, world_size = 0, 0, 1
    device = pick_device(cfg.train.device)
    if distributed:
        rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    master = rank == 0
    dtype = autocast_dtype(device, cfg.train.dtype)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype else nullcontext()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    tokens_per_micro = cfg.train.batch_size * cfg.model.block_size * world_size
    grad_accum = max(1, cfg.train.tokens_per_step // tokens_per_micro)
    if cfg.train.tokens_per_step and grad_accum * tokens_per_micro != cfg.train.tokens_per_step:
        raise ValueError(f"train.tokens_per_step={cfg.train.tokens_per_step} is not a multiple of batch_size x "
                         f"block_size x processes = {tokens_per_micro}; change one of them")
    out_dir = Path(cfg.out_dir)
    ckpt_path = out_dir / "ckpt.pt"
    if ckpt_path.exists() and not cfg.train.resume:
        raise ValueError(f"{out_dir} already holds a checkpoint; pass train.resume=true to continue it, or a new "
                         f"out_dir=... (nothing is overwritten)")
    if cfg.train.resume and not ckpt_path.exists():
        raise FileNotFoundError(f"train.resume=true but {ckpt_path} does not exist; train without resume first")

    # ---- data: rank 0 prepares the corpus once, the others wait and read it ----
    if master:
        data_dir = prepare(cfg.data, cfg.model.block_size)
    if distributed:
        dist.barrier()
        data_dir = prepare(cfg.data, cfg.model.block_size)
    meta = load_meta(data_dir)
    splits = {"train": load_split(data_dir, "train"), "val": load_split(data_dir, "val")}
    # ---- model: from scratch, from GPT-2's weights, or resumed from the checkpoint ----
    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
    ckpt = load_checkpoint(ckpt_path) if cfg.train.resume else None
    pretrained = None
    if cfg.train.init_from and ckpt is not None:  # the checkpoint already holds the fine-tuned weights
        model_cfg = ModelConfig(**ckpt["model_config"])
    elif cfg.train.init_from:
        model_cfg, pretrained = load_pretrained(cfg, meta)
    else:
        model_cfg = replace(cfg.model, vocab_size=meta["vocab_size"])
    cfg = replace(cfg, model=model_cfg)
    model = build_model(model_cfg)
    if pretrained is not None:
        model.load_state_dict(pretrained)
    model = model.to(device)
    optimizer = make_optimizer(model, cfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    start_iter, best_val, elapsed_before, skipped_steps = 0, float("inf"), 0.0, 0
    if ckpt is not None:
        if ckpt["meta"]["tokenizer"] != meta["tokenizer"]:  # checked first: it explains a vocab_size mismatch
            raise ValueError(f"checkpoint in {out_dir} used another tokenizer or vocabulary than data={cfg.data.name}"
                             f"; resume with the run's original data settings")
        check_same_model(ckpt["model_config"], asdict(model_cfg), out_dir)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_iter, best_val, elapsed_before = ckpt["iter"], ckpt["best_val_loss"], ckpt["elapsed_s"]
        skipped_steps = ckpt.get("skipped_steps", 0)
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and ckpt["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)
    raw_model = model
    data_rng = torch.Generator()
    if cfg.train.compile:
        model = torch.compile(model)
    eval_model = model
    if distributed:
        # the only buffers (RoPE and sinusoid tables) are computed identically on every rank: no per-step sync
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None, forward_sync_buffers=False)

    def checkpoint_state(it):
        return {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                "model_config": asdict(model_cfg), "config": asdict(cfg), "meta": meta, "iter": it,
                "best_val_loss": best_val, "elapsed_s": elapsed_before + time.time() - t_start,
                "skipped_steps": skipped_steps,
                "rng": {"torch": torch.get_rng_state(),
                        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}}

    # ---- the run's receipt: resolved config, command line, commit ----
    if master:
        out_dir.mkdir(parents=True, exist_ok=True)
        receipt = {"config": asdict(cfg), "argv": sys.argv, "git_commit": git_commit(), "world_size": world_size}
        (out_dir / "config.json").write_text(json.dumps(receipt, indent=2))
        n_params = raw_model.num_params()
        print(f"{model_cfg.type}: {n_params / 1e6:.2f}M parameters | data {cfg.data.name} ({meta['vocab_size']} "
              f"tokens vocab, {len(splits['train']):,} train tokens) | device {device}, {world_size} process(es), "
              f"{dtype or torch.float32} | {grad_accum} micro-step(s) of {tokens_per_micro:,} tokens per step")
        if cfg.train.resume:
            print(f"resuming from {ckpt_path} at iter {start_iter}")
        metrics_path = out_dir / "metrics.jsonl"
        if metrics_path.exists():  # a fresh run starts a new file; a resumed one continues from its checkpoint
            trim_metrics(metrics_path, start_iter if cfg.train.resume else -1)
        metrics = metrics_path.open("a")
        wandb_run = None
        if cfg.logger.wandb:
            import wandb
            wandb_run = wandb.init(project=cfg.logger.wandb_project, name=cfg.logger.wandb_run_name or out_dir.name,
                                   mode=cfg.logger.wandb_mode, config=asdict(cfg), dir=str(out_dir))

    def log(event, **values):
        row = {"event": event, "iter": it, "elapsed_s": round(elapsed_before + time.time() - t_start, 3), **values}
        metrics.write(json.dumps(row) + "\n")
        metrics.flush()
        if wandb_run:
            wandb_run.log({k: v for k, v in row.items() if k != "event"}, step=it)

    # ---- the loop ----
    stop_signals = []
    handlers = {s: signal.signal(s, lambda signum, _: stop_signals.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    ckpt_interval = cfg.train.checkpoint_interval or cfg.train.eval_interval
    tokens_per_iter = tokens_per_micro * grad_accum
    peak = peak_flops(device)
    flops_per_token = raw_model.flops_per_token() if peak else 0
    progress = tqdm(total=cfg.train.max_iters, initial=start_iter, disable=not master, dynamic_ncols=True,
                    mininterval=1.0, file=sys.stdout)
    t_start = t_last = time.time()
    it, tokens_per_sec, last = start_iter, 0.0, False

    def training_seconds():
        """Seconds trained so far (a resumed run's earlier ones included); rank 0's clock, so every rank agrees."""
        seconds = torch.tensor(elapsed_before + time.time() - t_start, device=device)
        if distributed:
            dist.broadcast(seconds, 0)
        return seconds.item()

    try:
        while True:
            seconds = training_seconds() if cfg.train.time_budget_s > 0 else 0.0
            last = it == cfg.train.max_iters or 0 < cfg.train.time_budget_s <= seconds
            resumed_here = cfg.train.resume and it == start_iter  # the killed run already evaluated here
            if master and not resumed_here and (it % cfg.train.eval_interval == 0 or last):
                losses = estimate_loss(eval_model, splits, cfg, device, autocast,
                                       full_val=last and cfg.train.final_eval == "full")
                log("eval", train_loss=losses["train"], val_loss=losses["val"], lr=get_lr(it, cfg, seconds))
                progress.write(f"iter {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                if losses["val"] < best_val:
                    best_val = losses["val"]
                    save_checkpoint(out_dir / "best.pt", checkpoint_state(it))
            if (it % ckpt_interval == 0 and it != start_iter) or last:
                state = checkpoint_state(it)
                if master:
                    save_checkpoint(ckpt_path, state)
            stop = torch.tensor(float(bool(stop_signals)))
            if distributed:  # every rank stops at the same step, or the others would wait forever
                dist.all_reduce(stop)
            if last or stop.item():
                break
            lr = get_lr(it, cfg, seconds)
            for group in optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
            step_loss = torch.zeros((), device=device)  # the mean loss over this step's global batch
            for micro in range(grad_accum):
                # micro-batch k of step `it` depends only on (seed, it, k), k counted across ranks: a resumed run draws
                # the same data, and 2 processes x 1 micro-step see the batches of 1 process x 2 micro-steps
                k = rank * grad_accum + micro
                data_rng.manual_seed((cfg.train.seed * 1_000_003 + it) * world_size * grad_accum + k)
                x, y = get_batch(splits["train"], cfg.train.batch_size, model_cfg.block_size, data_rng, device)
                sync = micro == grad_accum - 1  # DDP all-reduces gradients on the last micro-step only
                with (model.no_sync() if distributed and not sync else nullcontext()), autocast:
                    loss = model(x, y)[1] / grad_accum
                scaler.scale(loss).backward()
                step_loss += loss.detach()
            if distributed:  # every rank sees the same mean, so all stop or skip together
                dist.all_reduce(step_loss)
                step_loss /= world_size
            loss_value = step_loss.item()
            if not math.isfinite(loss_value):
                if not cfg.train.skip_nonfinite:
                    raise ValueError(f"the loss is {loss_value} at iter {it}; stopped before its optimizer step, "
                                     f"{ckpt_path} is left as it was; lower train.learning_rate, or pass "
                                     f"train.skip_nonfinite=true to skip such steps")
                skipped_steps += 1  # no optimizer step: the weights and their optimizer state stay as they were
                optimizer.zero_grad(set_to_none=True)
                it += 1
                progress.update()
                if master:  # logged at `it` like the "log" lines, so a resumed run trims it the same way
                    progress.write(f"iter {it - 1}: the loss is {loss_value}; step skipped ({skipped_steps} so far)")
                    log("skip", skipped_steps=skipped_steps)
                continue
            if cfg.train.grad_clip > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            it += 1
            progress.update()
            if it % cfg.logger.log_interval == 0 and master:
                now = time.time()
                tokens_per_sec = tokens_per_iter * cfg.logger.log_interval / (now - t_last)
                t_last = now
                mfu = {"mfu": round(flops_per_token * tokens_per_sec / (peak * world_size), 4)} if peak else {}
                log("log", train_loss=loss_value, lr=lr, tokens_per_sec=round(tokens_per_sec), **mfu)
                progress.set_postfix(loss=f"{loss_value:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_sec:,.0f}")
    finally:  # also when a signal, a non-finite loss or an error ends the loop
        progress.close()
        if master:
            metrics.close()
            if wandb_run:  # a run that a signal or an error ended shows as failed in wandb
                wandb_run.finish(exit_code=0 if last else 1)
        for s, handler in handlers.items():
            signal.signal(s, handler)
    if stop_signals:
        state = checkpoint_state(it)
        if master:
            save_checkpoint(ckpt_path, state)
            print(f"stopped by signal {stop_signals[0]} at iter {it}; checkpoint saved to {ckpt_path}; "
                  f"continue with train.resume=true out_dir={out_dir}")
        raise SystemExit(128 + stop_signals[0])

    # ---- teardown ----
    summary = {"iters": it, "best_val_loss": best_val, "skipped_steps": skipped_steps, "out_dir": str(out_dir)}
    if master:
        plot_losses(out_dir)
        print(f"done: {it} iterations, best val loss {best_val:.4f}; checkpoints and loss.png in {out_dir}")
    if distributed:
        dist.destroy_process_group()
    return summary


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(dict_cfg):
    from hydra.core.hydra_config import HydraConfig
    dict_cfg.out_dir = HydraConfig.get().runtime.output_dir  # a sweep job's own folder under out_dir
    try:
        cfg = OmegaConf.to_object(dict_cfg)
        train(cfg)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run_cli(main)
