"""The code paths GPU runs take, exercised on the CPU: train.compile=true (inductor) checkpoints plain names, resumes
and samples; train.dtype=float16 trains through a real GradScaler, which skips a step whose scaled gradients overflow
(AdamW alone and AdamW + Muon); fused AdamW on the CPU and CUDA; gloo on the CPU, NCCL on CUDA. Tiny models."""
import copy
import io
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from torch._dynamo.utils import counters

import attnlab.distributed as distributed
from attnlab.checkpoint import load_checkpoint
from attnlab.config import SampleConfig, TrainConfig
from attnlab.optim import make_optimizer, train_step
from attnlab.record import read_metrics
from model import GPT, GPTConfig
from sample import sample
from train import train

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
REAL_SCALER = torch.amp.GradScaler


def tiny_gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=17, block_size=8, n_layer=2, n_head=2, n_embd=16))


def fixed_batch():
    tokens = torch.randint(17, (4, 9), generator=torch.Generator().manual_seed(1))
    return tokens[:, :-1], tokens[:, 1:]


@pytest.mark.slow  # inductor's first compile is slow on a CPU; its cache makes reruns fast
def test_a_compiled_run_checkpoints_plain_names_resumes_like_an_eager_run_and_samples(tmp_path):
    # a constant lr, so 4 steps resumed to 6 are a straight 6-step run
    flat = dict(dtype="float32", max_iters=6, eval_interval=2, eval_iters=1, warmup_iters=0, learning_rate=3e-3,
                min_lr=3e-3)
    eager = tiny_config(tmp_path / "eager", **flat)
    train(eager)
    compiled = tiny_config(tmp_path / "compiled", **{**flat, "max_iters": 4}, compile=True)
    counters.clear()
    train(compiled)
    assert counters["stats"]["unique_graphs"] >= 2  # inductor compiled the training step and the evaluation
    ckpt = load_checkpoint(Path(compiled.out_dir) / "ckpt.pt")
    eager_ckpt = load_checkpoint(Path(eager.out_dir) / "ckpt.pt")
    assert not [k for k in ckpt["model"] if "_orig_mod" in k]
    assert ckpt["model"].keys() == eager_ckpt["model"].keys()

    train(replace(compiled, train=replace(compiled.train, resume=True, max_iters=6)))
    ckpt = load_checkpoint(Path(compiled.out_dir) / "ckpt.pt")
    assert ckpt["iter"] == 6
    compiled_evals, eager_evals = read_metrics(compiled.out_dir, "eval"), read_metrics(eager.out_dir, "eval")
    assert [r["iter"] for r in compiled_evals] == [r["iter"] for r in eager_evals] == [0, 2, 4, 6]
    # inductor fuses and reorders float32 arithmetic: the same run up to rounding (observed: 5e-7), where one AdamW
    # step moves each weight by about lr = 3e-3
    for a, b in zip(compiled_evals, eager_evals):
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-4)
    assert max((ckpt["model"][k] - v).abs().max().item() for k, v in eager_ckpt["model"].items()) < 1e-4

    out = io.StringIO()
    texts = sample(SampleConfig(out_dir=compiled.out_dir, checkpoint="latest", device="cpu", dtype="float32",
                                prompt="def", max_new_tokens=20), out=out)
    assert texts[0].startswith("def") and len(texts[0]) == 3 + 20 and out.getvalue() == texts[0] + "\n"


class RecordingScaler(REAL_SCALER):
    """torch's GradScaler, keeping what each scale() multiplied the loss by and how many steps it was asked for."""
    made = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.factors, self.steps = [], 0
        RecordingScaler.made.append(self)

    def scale(self, outputs):
        scaled = super().scale(outputs)
        self.factors.append((scaled / outputs).item())
        return scaled

    def step(self, optimizer, *args, **kwargs):
        self.steps += 1
        return super().step(optimizer, *args, **kwargs)


@pytest.mark.parametrize("dtype, scaled", [("float16", True), ("bfloat16", False), ("float32", False)])
def test_only_float16_trains_through_an_enabled_grad_scaler_and_learns_like_float32(tmp_path, monkeypatch, dtype,
                                                                                   scaled):
    monkeypatch.setattr(torch.amp, "GradScaler", RecordingScaler)
    monkeypatch.setattr(RecordingScaler, "made", [])
    cfg = tiny_config(tmp_path / dtype, dtype=dtype, max_iters=20, eval_interval=10)
    summary = train(cfg)
    [scaler] = RecordingScaler.made
    assert scaler.is_enabled() == scaled and scaler.steps == (20 if scaled else 0)  # else no scaler takes part
    # a disabled scaler hands the loss back as it is; fp16's starts at 2^16, halved at each overflow
    assert scaler.factors[0] == (65536.0 if scaled else 1.0) and all(f >= 1.0 for f in scaler.factors)
    evals = read_metrics(cfg.out_dir, "eval")
    assert all(math.isfinite(r["val_loss"]) for r in evals) and summary["skipped_steps"] == 0
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5  # it learned
    if dtype == "float16":  # autocast took part (other numbers) and cost little accuracy
        fp32 = tiny_config(tmp_path / "fp32", dtype="float32", max_iters=20, eval_interval=10)
        train(fp32)
        fp32_loss = read_metrics(fp32.out_dir, "eval")[-1]["val_loss"]
        assert evals[-1]["val_loss"] != fp32_loss and evals[-1]["val_loss"] == pytest.approx(fp32_loss, abs=0.05)


@pytest.mark.parametrize("grad_clip", [0.0, 1.0])  # 1.0: train_step unscales before clipping; 0: scaler.step does
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_an_overflowing_fp16_step_is_skipped_and_the_scale_halves_until_the_gradients_fit(optimizer, grad_clip):
    model = tiny_gpt()
    opt = make_optimizer(model, TrainConfig(optimizer=optimizer), CPU)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)  # the loss's gradient times 2^40 overflows fp16
    amp = torch.autocast("cpu", dtype=torch.float16)
    before = copy.deepcopy(model.state_dict())
    loss = train_step(model, opt, [fixed_batch()], grad_clip, amp, scaler)
    assert math.isfinite(loss)  # only the scaled gradients overflowed, so train_step handed the step to the scaler
    assert scaler.get_scale() == 2.0 ** 39
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # weight decay would move them
    # no step at all, not one with zero gradients: a fused AdamW, handed the overflow, makes its state in the kernel
    # and takes its step count back to 0; Muon keeps no count, so any state of its own would be a step
    assert not any(s.get("step", 1) for o in distributed.torch_optimizers(opt) for s in o.state.values())
    assert all(p.grad is None for p in model.parameters())

    skipped = 1
    while True:
        train_step(model, opt, [fixed_batch()], grad_clip, amp, scaler)
        if any(not torch.equal(v, before[k]) for k, v in model.state_dict().items()):
            break
        skipped += 1
        assert skipped < 40, "no step landed"
    assert skipped > 1 and scaler.get_scale() == 2.0 ** (40 - skipped)  # each skip halved it, the landing kept it
    assert all(not torch.equal(v, before[k]) for k, v in model.state_dict().items())  # every parameter moved
    assert all(o.state for o in distributed.torch_optimizers(opt))  # Muon's as well as AdamW's


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_make_optimizer_asks_for_fused_adamw_on_the_cpu_and_cuda(optimizer):
    devices = [(CPU, True), (torch.device("cuda"), True), (torch.device("mps"), False)]
    for device, fused in devices:  # the optimizer builds over CPU tensors whatever device it is asked for
        adamw = distributed.torch_optimizers(make_optimizer(tiny_gpt(), TrainConfig(optimizer=optimizer), device))[0]
        assert isinstance(adamw, torch.optim.AdamW)
        assert adamw.defaults["fused"] is fused and all(g["fused"] is fused for g in adamw.param_groups)


def torchrun_env(monkeypatch, rank, local_rank, world_size):
    """torchrun's variables for one process, and dist.init_process_group recording its backend instead of joining."""
    for name, value in (("RANK", rank), ("LOCAL_RANK", local_rank), ("WORLD_SIZE", world_size)):
        monkeypatch.setenv(name, str(value))
    backends = []
    monkeypatch.setattr(distributed.dist, "init_process_group", backends.append)
    return backends


def test_setup_processes_is_one_process_without_torchrun_and_gloo_on_the_cpu_under_it(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.setup_processes("cpu") == distributed.Processes(CPU)
    backends = torchrun_env(monkeypatch, rank=3, local_rank=1, world_size=4)
    procs = distributed.setup_processes("cpu")
    assert backends == ["gloo"]
    assert procs == distributed.Processes(CPU, rank=3, local_rank=1, world_size=4, distributed=True)
    assert not procs.master


@needs_cuda
def test_setup_processes_takes_nccl_and_the_local_rank_s_gpu_on_cuda(monkeypatch):
    backends = torchrun_env(monkeypatch, rank=1, local_rank=0, world_size=2)
    procs = distributed.setup_processes("cuda")
    assert backends == ["nccl"]
    assert procs.device == torch.device("cuda", 0) and torch.cuda.current_device() == 0
