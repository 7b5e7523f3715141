"""Where the arithmetic runs: device choice, autocast dtype, GPU peaks for MFU, timing, peak memory, the machine's name.

Shared by train.py, sample.py, scripts/bench.py and scripts/report, so each picks devices and times work the same
way. What only CUDA has (TF32, pinned memory, NCCL) is decided here, in small functions the CPU tests reach too.
"""
import os
import platform
import re
import statistics
import subprocess
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch


def pick_device(name):
    """torch.device for a config's device: auto takes cuda, then mps, then cpu."""
    if name != "auto":
        try:
            device = torch.device(name)
        except RuntimeError:
            device = None
        if device is None or device.type not in ("cpu", "cuda", "mps"):
            raise ValueError(f"device {name!r} is unknown; use auto, cpu, cuda, cuda:N or mps")
        if (device.type == "cuda" and not torch.cuda.is_available()
                or device.type == "mps" and not torch.backends.mps.is_available()):
            raise ValueError(f"device {name!r} is not available on this machine; use auto or cpu")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def native_bf16(device):
    """Whether device computes bf16 natively: CUDA where supported, a CPU with AVX512-BF16 or AMX. Elsewhere torch
    emulates it, many times slower than fp32 (docs/log.md), so fp32 is the fast choice."""
    if device.type == "cuda":  # emulation (a pre-Ampere GPU) counts as not native: no flash kernel, slow matmuls
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu" and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def autocast_dtype(device, name):
    """The dtype to autocast to, or None for plain fp32. auto: bf16 where the device computes it natively."""
    if name == "auto":
        return torch.bfloat16 if native_bf16(device) else None
    return None if name == "float32" else getattr(torch, name)


def autocast(device, dtype):
    """The autocast context for dtype (None: none at all)."""
    return torch.autocast(device.type, dtype=dtype) if dtype else nullcontext()


def activation_dtype(model, device):
    """The dtype model's activations (and so a KV cache's keys) take on device now: autocast's where it is on, else
    the parameters'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return next(model.parameters()).dtype


def configure(device):
    """Backend switches for device: TF32 matmuls on CUDA (fp32 accuracy is not needed for training there)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True


def to_device(tensor, device):
    """Copy a CPU tensor to device; through pinned memory without blocking on CUDA."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


# Dense (no sparsity) bf16 peak FLOP/s of common GPUs, from the vendor datasheets; the first name contained in
# torch.cuda.get_device_name() wins. MFU is the model's FLOPs per second over this (PaLM, Chowdhery et al. 2022).
PEAK_FLOPS = [("H100 NVL", 835e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("H200 NVL", 835e12), ("H200", 989e12),
              ("B200", 2250e12), ("A100", 312e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12)]


def peak_flops(device):
    """The device's bf16 peak in FLOP/s, or None where it is not in PEAK_FLOPS (every CPU)."""
    if device.type != "cuda":
        return None
    return peak_of(torch.cuda.get_device_name(device))


def peak_of(name):
    """PEAK_FLOPS' figure for a device name: the first key found in it as a whole word ("L4" is not "L40")."""
    return next((flops for key, flops in PEAK_FLOPS if re.search(rf"\b{re.escape(key)}\b", name)), None)


def sync(device):
    """Wait for device's queued work, so a clock read after it times the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def process_age_s():
    """Seconds since this process started (Linux's /proc; 0 where it cannot be read): a deadline counted from
    there includes the imports and the device's start-up."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, in clock ticks after boot
        return max(0.0, float(Path("/proc/uptime").read_text().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return 0.0


class Deadline:
    """Seconds left before a wall-clock end, and whether a part predicted to take some seconds fits in them beside a
    reserve; past the end nothing fits, however small. The time limit of bench's and the report's GPU checks."""

    def __init__(self, seconds, clock=time.monotonic):
        self.clock, self.end = clock, clock() + seconds

    def left(self):
        return self.end - self.clock()

    def fits(self, predicted_s, reserve_s=0.0):
        return self.left() > 0 and predicted_s + reserve_s <= self.left()


def alternate_rounds(fns, rounds, device):
    """Call each of fns once per round, in turn (A B A B ...); every call's seconds, by name. A neighbour that slows
    a shared machine for a while then slows every side alike."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(seconds_of(fn, device))
    return times


def alternate(fns, rounds, device):
    """The median seconds per call of each of fns, called in alternating rounds (alternate_rounds)."""
    return {name: statistics.median(t) for name, t in alternate_rounds(fns, rounds, device).items()}


def seconds_of(fn, device):
    """The wall time of one call of fn, its device work included."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def time_steps(steps, rounds, device, warmup=1, call_s=0.0):
    """Seconds per training step of each of steps (name: a function that takes one step), one figure per round:
    warmup steps first (the allocator, the optimizer's state, compilation), then one more timed to size the calls,
    each call as many steps as fill call_s (one at least), the calls in alternating rounds. scripts/bench.py and
    scripts/report time training steps with this, so both time a step alike."""
    repeats = {}
    for name, step in steps.items():
        for _ in range(warmup):
            step()
        repeats[name] = max(1, round(call_s / seconds_of(step, device)))

    def call(step, repeat):
        for _ in range(repeat):
            step()

    calls = {name: partial(call, step, repeats[name]) for name, step in steps.items()}
    return {name: [t / repeats[name] for t in times] for name, times in alternate_rounds(calls, rounds, device).items()}


def peak_bytes(fn, device):
    """The most memory fn's tensors hold at once, beyond what was allocated before: on CUDA the allocator's own
    peak; on the CPU the running sum of the profiler's allocation and free events, which cover every tensor the
    CPU allocator hands out, the fused kernels' own buffers included."""
    if device.type == "cuda":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()  # negative for a free
        peak = max(peak, live)
    return peak


def hardware_name(device):
    """What a figure was measured on: the GPU, or the CPU model, torch's CPU capability and the thread count."""
    if device.type == "cuda":
        return f"GPU {torch.cuda.get_device_name(device)}"
    try:  # a VM may name only the brand: the family and model numbers tell its generation
        info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                    if ":" in line)
        info = {key.strip(): value.strip() for key, value in info.items()}
        cpu = f"{info['model name']} (family {info['cpu family']}, model {info['model']})"
    except (OSError, KeyError):
        cpu = platform.processor() or platform.machine()
    return (f"CPU {cpu}, {os.cpu_count()} cores, torch capability {torch.backends.cpu.get_cpu_capability()}, "
            f"{torch.get_num_threads()} thread(s)")


def git_commit():
    """The commit of this checkout, for a run's receipt; None outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None
