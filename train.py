"""Train a GPT (or the RNN baseline, model=lstm|gru|mingru) on a text corpus.

    python train.py                                     # built-in corpus (Python's stdlib), a few CPU minutes
    python train.py experiment=shakespeare_char         # a recipe from configs/experiment/
    python train.py model.n_layer=4 train.max_iters=500 out_dir=out/mini
    python train.py train.resume=true out_dir=out/mini  # continue exactly where a run stopped
    torchrun --standalone --nproc_per_node=2 train.py   # DDP: one process per device
    torchrun --standalone --nproc_per_node=2 train.py train.parallel=fsdp  # FSDP2: each holds 1/2 of the model

Every option and its default is in attnlab/config.py; configs/ holds named presets. `train(cfg)` is the whole
story in named steps: the corpus, processes and device, model and optimizer (from scratch, from GPT-2 or resumed), the
loop, teardown.
"""
import math
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from attnlab.batches import get_batch, micro_batches
from attnlab.checkpoint import (
    TrainingState,
    build_model,
    check_resumable,
    checkpoint_to_resume,
    load_checkpoint,
    saved_config,
    saved_model_config,
)
from attnlab.cli import one_line_errors, run_cli
from attnlab.config import CONFIG_DIR, Config, register_configs, resumed_config
from attnlab.distributed import Processes, setup_processes, shard, wrap
from attnlab.hf import pretrained_gpt2
from attnlab.optim import get_lr, make_optimizer, set_lr, train_step, warmup_steps
from attnlab.record import RunLog
from attnlab.runtime import autocast, autocast_dtype, configure, peak_flops, skip_exit_collections
from attnlab.scoring import Tally, byte_counts, full_score, score_batch
from data.corpus import load_meta, load_split, prepare
from data.tokenizers import load_tokenizer

register_configs()


def micro_steps(cfg, world_size):
    """Gradient accumulation derived from the tokens per step asked for: (micro-steps, tokens per micro-step)."""
    tokens_per_micro = cfg.train.batch_size * cfg.model.block_size * world_size
    grad_accum = max(1, cfg.train.tokens_per_step // tokens_per_micro)
    if cfg.train.tokens_per_step and grad_accum * tokens_per_micro != cfg.train.tokens_per_step:
        raise ValueError(f"train.tokens_per_step={cfg.train.tokens_per_step} is not a multiple of batch_size x "
                         f"block_size x processes = {tokens_per_micro}; change one of them")
    return grad_accum, tokens_per_micro


def load_data(cfg):
    """The corpus, prepared once (or found prepared) and read. Every process calls it before the process group
    starts: one prepares under the corpus's file lock while the others wait on it, so no collective's timeout (NCCL's
    10 minutes) runs out during a long preparation."""
    data_dir = prepare(cfg.data, cfg.model.block_size)
    return load_meta(data_dir), {split: load_split(data_dir, split) for split in ("train", "val")}


def model_config(cfg, meta, ckpt):
    """The model this run trains, and GPT-2's weights when it starts from them: a resumed fine-tune keeps its
    checkpoint's model, init_from takes GPT-2's, else cfg.model sized to the corpus's vocabulary."""
    if cfg.train.init_from and ckpt is not None:
        return saved_model_config(ckpt), None
    if cfg.train.init_from:
        return pretrained_gpt2(cfg.train.init_from, cfg.model, meta)
    return replace(cfg.model, vocab_size=meta["vocab_size"]), None


def build_state(cfg, meta, ckpt, procs):
    """The run's config (cfg with its model resolved) and its training state: from scratch, GPT-2 or ckpt; under
    FSDP, this process's shards of it."""
    model_cfg, pretrained = model_config(cfg, meta, ckpt)
    cfg = replace(cfg, model=model_cfg)
    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
    model = build_model(model_cfg)
    if pretrained is not None:
        model.load_state_dict(pretrained)
    model = shard(model.to(procs.device), cfg.train.parallel, procs, autocast_dtype(procs.device, cfg.train.dtype))
    state = TrainingState(model, make_optimizer(model, cfg.train, procs.device))
    if ckpt is not None:
        check_resumable(ckpt, cfg, meta)
        state.load(ckpt)
    return cfg, state


@dataclass(frozen=True)
class Run:
    """What stays the same while a run trains, which the loop's helpers share."""
    cfg: Config  # with the model resolved (build_state)
    meta: dict  # the corpus's meta.json
    splits: dict  # "train" and "val": token ids
    counts: torch.Tensor  # scoring.byte_counts of the corpus's tokenizer, for bits per byte
    amp: object  # the autocast context of every forward pass
    procs: Processes
    run_log: RunLog
    start_iter: int  # the iteration this process starts from: 0, or a resumed checkpoint's
    resumed: bool

    @property
    def ckpt_path(self):
        return Path(self.cfg.out_dir) / "ckpt.pt"


@torch.no_grad()
def estimate_loss(model, run, full_val=False):
    """(loss, bits per byte) per split over eval_iters batches; the same batches every time, so estimates compare.
    The loss is the mean of the batches' mean losses. With full_val, the val split's are over all of its tokens
    instead (scoring.full_score)."""
    cfg = run.cfg
    model.eval()
    scores = {}
    for name, data in run.splits.items():
        if full_val and name == "val":
            tally = full_score(model, data, cfg.train.batch_size, cfg.model.block_size, run.counts, run.amp)
            scores[name] = tally.loss, tally.bits_per_byte
            continue
        generator = torch.Generator().manual_seed(cfg.train.seed)
        tally = Tally(run.counts)
        total = 0.0
        for _ in range(cfg.train.eval_iters):
            x, y = get_batch(data, cfg.train.batch_size, cfg.model.block_size, generator, run.counts.device)
            total += score_batch(model, x, y, tally, run.amp).item()
        scores[name] = total / cfg.train.eval_iters, tally.bits_per_byte
    model.train()
    return scores


class StopSignals:
    """SIGINT, SIGTERM and SIGUSR1 (Slurm's and submitit's warning before a time limit), recorded instead of raised
    while the loop runs, so it stops at a step boundary with a checkpoint."""

    def __enter__(self):
        self.received = []
        self.handlers = {s: signal.signal(s, lambda signum, _: self.received.append(signum))
                         for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
        return self

    def __exit__(self, *exc):
        for s, handler in self.handlers.items():
            signal.signal(s, handler)

    def first(self):
        """The first signal received, 0 for none."""
        if self.received:
            return self.received[0]
        return 0


class Stopped(Exception):
    """train() ended at a step boundary by a stop signal, its checkpoint saved; main() exits with 128 + signum."""

    def __init__(self, signum):
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


class Speedometer:
    """Seconds trained, a resumed run's earlier ones included, and at each reading the tokens/s and MFU since the
    last one. MFU: the model's FLOPs per second over the devices' peak, where the peak is known (a GPU's)."""

    def __init__(self, clock, state, tokens_per_step, procs):
        self.clock = clock
        self.tokens_per_step = tokens_per_step
        self.peak = peak_flops(procs.device)  # FLOP/s of one device, None where unknown
        self.flops_per_token = state.model.flops_per_token() if self.peak else 0
        self.world_size = procs.world_size
        self.t_zero = self.clock() - state.elapsed_s  # when training would have begun, earlier runs included
        self.t_last = self.clock()

    def elapsed_s(self):
        return self.clock() - self.t_zero

    def reading(self, steps):
        """(seconds trained, tokens/s over the last `steps` steps, MFU or None) now."""
        now = self.clock()
        tokens_per_sec = self.tokens_per_step * steps / (now - self.t_last)
        self.t_last = now
        mfu = None
        if self.peak:
            mfu = round(self.flops_per_token * tokens_per_sec / (self.peak * self.world_size), 4)
        return now - self.t_zero, tokens_per_sec, mfu


def print_start(run, state, dtype, grad_accum, tokens_per_micro):
    """Rank 0 says what trains on what, and where a resumed run continues."""
    cfg = run.cfg
    run.run_log.print(f"{cfg.model.type}: {state.model.num_params() / 1e6:.2f}M parameters | data {cfg.data.name} "
                      f"({run.meta['vocab_size']} tokens vocab, {len(run.splits['train']):,} train tokens) | device "
                      f"{run.procs.device}, {run.procs.world_size} process(es), {dtype or torch.float32} | "
                      f"{grad_accum} micro-step(s) of {tokens_per_micro:,} tokens per step")
    if run.resumed:
        run.run_log.print(f"resuming from {run.ckpt_path} at iter {run.start_iter}")
    if warmup_steps(cfg.train) != cfg.train.warmup_iters:
        run.run_log.print(f"train.warmup_iters={cfg.train.warmup_iters} would take the whole run of "
                          f"{cfg.train.max_iters} steps: warming up over {warmup_steps(cfg.train)} instead")


class BudgetClock:
    """Seconds trained as every process agrees on them, for the time budget's lr and stop (0 without a budget).
    Alone, the clock itself. Under torchrun rank 0's reading is broadcast at log steps only (a collective the CPU
    waits for); in between every process counts on the seconds per step of the last interval, so the lr and the stop
    are the same on every rank without a read per step."""

    def __init__(self, run, elapsed_s):
        self.run = run
        self.budget = run.cfg.train.time_budget_s > 0
        self.synced_iter, self.synced_s, self.per_step = run.start_iter, 0.0, 0.0
        if self.budget and run.procs.distributed:
            self.synced_s = run.procs.from_rank0(elapsed_s)

    def seconds(self, it, elapsed_s):
        if not self.budget:
            return 0.0
        if not self.run.procs.distributed:
            return elapsed_s
        if is_log_step(it, self.run) and it > self.synced_iter:
            now = self.run.procs.from_rank0(elapsed_s)
            self.per_step = (now - self.synced_s) / (it - self.synced_iter)
            self.synced_iter, self.synced_s = it, now
        return self.synced_s + (it - self.synced_iter) * self.per_step


def is_finished(it, seconds, run):
    """max_iters reached, or the time budget spent."""
    return it == run.cfg.train.max_iters or 0 < run.cfg.train.time_budget_s <= seconds


def should_evaluate(it, finished, run):
    """Every eval_interval steps and at the end; not at the iteration a resumed run starts from, which the run that
    saved the checkpoint evaluated."""
    if run.resumed and it == run.start_iter:
        return False
    return it % run.cfg.train.eval_interval == 0 or finished


def should_checkpoint(it, finished, run):
    """At the end, and every checkpoint_interval steps (eval_interval by default) after the start."""
    if finished:
        return True
    interval = run.cfg.train.checkpoint_interval or run.cfg.train.eval_interval
    return it % interval == 0 and it != run.start_iter


def is_log_step(it, run):
    """Every log_interval steps every process reads its losses, and rank 0 logs them."""
    return it % run.cfg.logger.log_interval == 0


def validate(run, model, state, lr, final):
    """Log train and val losses and bits per byte (the whole val split at the end, with final_eval=full); a new best
    saves best.pt. Every process evaluates, since a sharded model's forward needs them all; rank 0's val loss
    decides. Returns the val loss."""
    full_val = final and run.cfg.train.final_eval == "full"
    scores = estimate_loss(model, run, full_val=full_val)
    train_loss, train_bpb = scores["train"]
    val_loss, val_bpb = scores["val"]
    run.run_log.log("eval", state.iter, state.elapsed_s, train_loss=train_loss, val_loss=val_loss,
                    train_bpb=train_bpb, val_bpb=val_bpb, lr=lr)
    run.run_log.print(f"iter {state.iter}: train loss {train_loss:.4f}, val loss {val_loss:.4f} "
                      f"({val_bpb:.4f} bits/byte)")
    val_loss = run.procs.from_rank0(val_loss)  # so every process joins the same saves
    if val_loss < state.best_val_loss:
        state.best_val_loss = val_loss
        state.save(Path(run.cfg.out_dir) / "best.pt", run.cfg, run.meta, run.procs.master)
    return val_loss


class StepLosses:
    """The training losses, kept on the device between reads so that no step waits for the device to read its own:
    the last step's loss, and the steps whose loss was not finite since the last read (their count, the first one's
    iteration and loss)."""

    def __init__(self, device):
        self.last = torch.zeros((), device=device)
        self.nonfinite = torch.zeros((), dtype=torch.long, device=device)
        self.first_iter = torch.zeros((), dtype=torch.long, device=device)
        self.first_loss = torch.zeros((), device=device)

    def add(self, loss, it):
        """Step it's loss, a 0-d tensor on the device."""
        bad = ~loss.isfinite()
        first = bad & (self.nonfinite == 0)
        self.first_iter.masked_fill_(first, it)
        self.first_loss = torch.where(first, loss, self.first_loss)
        self.nonfinite += bad
        self.last = loss

    def frozen(self):
        """True on the device once a step's loss was not finite: the steps after it are skipped too."""
        return self.nonfinite > 0

    def read(self):
        """(the last loss, non-finite steps since the last read, the first one's iteration and loss): one host read."""
        values = torch.stack([self.last.double(), self.nonfinite.double(), self.first_iter.double(),
                              self.first_loss.double()]).tolist()
        self.nonfinite.zero_()
        return values[0], int(values[1]), int(values[2]), values[3]


def read_losses(run, state, losses, speed):
    """At a log step, and before an evaluation, a checkpoint or a stop: read the losses. A non-finite one ends the run
    (its step and every one after it were skipped on the device, so the checkpoint stays as it was), unless
    train.skip_nonfinite counts and logs such steps. Returns the last step's loss."""
    loss, nonfinite, first_iter, first_loss = losses.read()
    if nonfinite and not run.cfg.train.skip_nonfinite:
        raise ValueError(f"the loss is {first_loss} at iter {first_iter}; stopped before its optimizer step, "
                         f"{run.ckpt_path} is left as it was; lower train.learning_rate, or pass "
                         f"train.skip_nonfinite=true to skip such steps")
    if nonfinite:
        state.skipped_steps += nonfinite
        run.run_log.print(f"iter {first_iter}: the loss is {first_loss}; step skipped ({nonfinite} since the last "
                          f"log, {state.skipped_steps} so far)")
        run.run_log.log("skip", state.iter, speed.elapsed_s(), skipped_steps=state.skipped_steps)
    return loss


def stop_requested(signals, it, run):
    """The first stop signal any process received, 0 for none. Under torchrun every process must agree, through a
    collective whose result the CPU waits for: it is read at log steps only."""
    if not run.procs.distributed:
        return signals.first()
    if it % run.cfg.logger.log_interval:
        return 0
    return run.procs.max(signals.first())


def log_step(run, state, speed, loss, lr):
    """A "log" row and the progress bar's figures: the step's loss and lr, tokens/s and MFU since the last row."""
    elapsed_s, tokens_per_sec, mfu = speed.reading(run.cfg.logger.log_interval)
    run.run_log.log("log", state.iter, elapsed_s, train_loss=loss, lr=lr, tokens_per_sec=round(tokens_per_sec),
                    mfu=mfu)
    run.run_log.progress.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_sec:,.0f}")


def save_for_resume(run, state, signum):
    """After SIGINT, SIGTERM or SIGUSR1 on any process: checkpoint every finished step, say how to continue."""
    state.save(run.ckpt_path, run.cfg, run.meta, run.procs.master)
    if run.procs.master:
        print(f"stopped by signal {signum} at iter {state.iter}; checkpoint saved to {run.ckpt_path}; "
              f"continue with train.resume=true out_dir={run.cfg.out_dir}")


def teardown(run, state):
    """Plot the losses, say where the run is, and end the process group."""
    run.run_log.plot()
    run.run_log.print(f"done: {state.iter} iterations, best val loss {state.best_val_loss:.4f}; checkpoints and "
                      f"loss.png in {run.cfg.out_dir}")
    if run.procs.distributed:
        dist.barrier()  # else gloo's teardown could deadlock (on the GIL) with the last collective's clean-up
        dist.destroy_process_group()


def train(cfg: Config, clock=time.time, ckpt=None):
    """Train as cfg says; returns a summary of the run. Raises Stopped after a stop signal (its checkpoint saved),
    ValueError for a config or data mistake, OSError when a checkpoint cannot be written. clock: seconds, for the
    time budget, speeds and logs; ckpt: the checkpoint to resume, where the caller read it already."""
    # the checkpoint to resume and the corpus, before the process group starts
    ckpt = checkpoint_to_resume(cfg, ckpt)
    meta, splits = load_data(cfg)
    # setup: processes, device, dtype, gradient accumulation (build_state seeds the weights)
    procs = setup_processes(cfg.train.device)
    dtype = autocast_dtype(procs.device, cfg.train.dtype)
    amp = autocast(procs.device, dtype)
    configure(procs.device)
    grad_accum, tokens_per_micro = micro_steps(cfg, procs.world_size)
    # the model and optimizer: from scratch, from GPT-2 or resumed
    cfg, state = build_state(cfg, meta, ckpt, procs)
    counts = byte_counts(load_tokenizer(meta), procs.device)
    # compile / DDP wrap, and the run's record
    model, eval_model = wrap(state.model, cfg.train.compile, procs)
    scaler = torch.amp.GradScaler(procs.device.type, enabled=dtype == torch.float16)
    run_log = RunLog(cfg, procs, state.iter, wandb_id=state.wandb_id)
    state.wandb_id = run_log.wandb_id
    run = Run(cfg, meta, splits, counts, amp, procs, run_log, start_iter=state.iter, resumed=ckpt is not None)
    print_start(run, state, dtype, grad_accum, tokens_per_micro)
    speed = Speedometer(clock, state, tokens_per_step=grad_accum * tokens_per_micro, procs=procs)
    budget_clock = BudgetClock(run, state.elapsed_s)
    # the loop: lr, eval, checkpoint, stop, micro-steps, clip and step, log
    finished = False  # the finally records it: a run finished or stopped
    val_loss = None
    stop_signal = 0
    losses = StepLosses(procs.device)
    try:
        with StopSignals() as signals:
            while True:
                state.elapsed_s = speed.elapsed_s()
                seconds = budget_clock.seconds(state.iter, state.elapsed_s)
                finished = is_finished(state.iter, seconds, run)
                lr = get_lr(state.iter, cfg.train, seconds)
                evaluating = should_evaluate(state.iter, finished, run)
                checkpointing = should_checkpoint(state.iter, finished, run)
                stop_signal = stop_requested(signals, state.iter, run)
                if evaluating or checkpointing or finished or stop_signal:
                    read_losses(run, state, losses, speed)  # a non-finite loss ends the run here, before any save
                if evaluating:
                    val_loss = validate(run, eval_model, state, lr=lr, final=finished)
                if checkpointing:
                    state.save(run.ckpt_path, cfg, meta, procs.master)
                if finished or stop_signal:
                    break
                set_lr(state.optimizer, lr)
                batches = micro_batches(splits["train"], state.iter, cfg, procs, grad_accum)
                frozen = None if cfg.train.skip_nonfinite else losses.frozen()
                loss = train_step(model, state.optimizer, batches, cfg.train.grad_clip, amp, scaler, procs.mean,
                                  frozen, procs.max_)
                losses.add(loss, state.iter)
                state.iter += 1
                run_log.progress.update()
                if is_log_step(state.iter, run):
                    loss = read_losses(run, state, losses, speed)
                    if math.isfinite(loss):
                        log_step(run, state, speed, loss=loss, lr=lr)
    finally:  # also when a signal, a non-finite loss or an error ends the loop
        run_log.close(finished)
    if stop_signal:
        save_for_resume(run, state, stop_signal)
        raise Stopped(stop_signal)
    teardown(run, state)
    return {"iters": state.iter, "val_loss": val_loss, "best_val_loss": state.best_val_loss,
            "skipped_steps": state.skipped_steps, "out_dir": cfg.out_dir}


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")
@one_line_errors
def main(dict_cfg):
    """The command line; returns the run's last val loss, which a Hydra sweeper (Optuna's) minimises."""
    hydra_cfg = HydraConfig.get()
    dict_cfg.out_dir = hydra_cfg.runtime.output_dir  # a sweep job's own folder under out_dir
    if hydra_cfg.mode == RunMode.MULTIRUN and dict_cfg.logger.wandb_group is None:
        dict_cfg.logger.wandb_group = Path(hydra_cfg.sweep.dir).name  # a sweep's jobs side by side in wandb
    ckpt_path = Path(dict_cfg.out_dir) / "ckpt.pt"
    ckpt = None
    if dict_cfg.train.resume and ckpt_path.exists():  # read once: its config here, its state in train()
        ckpt = load_checkpoint(ckpt_path)
        cfg = resumed_config(dict_cfg, saved_config(ckpt), hydra_cfg.overrides.task)
    else:
        cfg = OmegaConf.to_object(dict_cfg)
    try:
        return train(cfg, ckpt=ckpt)["val_loss"]
    except Stopped as stopped:  # the exit status a shell reports for a process that signum ended
        raise SystemExit(128 + stopped.signum) from None


if __name__ == "__main__":
    run_cli(main)
    skip_exit_collections()
