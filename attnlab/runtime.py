"""Where the arithmetic runs: device choice, autocast dtype, GPU peaks for MFU, device syncs, the process's heap and
exit, the run's commit.

Shared by train.py, sample.py and the scripts, so each picks devices the same way. What only CUDA has (TF32, pinned
memory) is decided here, in small functions the CPU tests reach too. The timing kit lives in scripts/timing.py.
"""
import ctypes
import ctypes.util
import gc
import os
import re
import subprocess
from contextlib import nullcontext
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
    """Backend switches for device: TF32 matmuls on CUDA (fp32 accuracy is not needed for training there); on the
    CPU, freed tensor memory kept for the next step (keep_freed_memory)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if device.type == "cpu":
        keep_freed_memory()


# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def keep_freed_memory():
    """Where the C library is glibc: serve tensors of up to 32 MiB from the heap and never shrink it, instead of
    handing freed blocks back to the OS and page-faulting them in again at every step (docs/log.md).
    Returns whether it applied; elsewhere (musl, macOS, Windows) nothing changes."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    # both or neither: a trim threshold alone turns off glibc's adaptive mmap threshold, and every block mmaps
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20) and mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1))


def skip_exit_collections():
    """A command's last call: freeze what is left, so that Python's collections at exit do not scan every object torch
    made once more (docs/log.md). Not under torchrun, where a freeze while the process group was alive once ended a
    worker in an abort at exit. Returns whether it froze."""
    if "WORLD_SIZE" in os.environ:
        return False
    gc.freeze()
    return True


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


def git_commit():
    """The commit of this checkout, for a run's receipt; None outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None
