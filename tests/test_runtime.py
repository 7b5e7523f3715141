"""attnlab/runtime.py: device choice and its one-line errors, autocast dtypes, peaks, the git commit. GPU-only checks
are skipped without CUDA."""
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO

import attnlab.runtime as runtime
from attnlab.config import DTYPES

CPU = torch.device("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_pick_device_cpu_and_auto_on_a_cpu_machine():
    assert runtime.pick_device("cpu") == CPU
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("auto picks the accelerator here")
    assert runtime.pick_device("auto") == CPU


@pytest.mark.parametrize("name, problem", [("tpu", "is unknown"), ("cuda:x", "is unknown"),
                                           ("cuda", "is not available on this machine")])
def test_pick_device_names_a_bad_or_missing_device_in_one_line(name, problem):
    if name == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match=f"device '{re.escape(name)}' {problem}; use auto") as error:
        runtime.pick_device(name)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("avx512_bf16, amx", [(False, False), (True, False), (False, True)])
def test_autocast_dtype_of_every_name_on_cpu(monkeypatch, avx512_bf16, amx):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    native = torch.bfloat16 if avx512_bf16 or amx else None
    expected = {"auto": native, "float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
    assert set(expected) == set(DTYPES)
    assert {name: runtime.autocast_dtype(CPU, name) for name in DTYPES} == expected


def test_native_bf16_on_this_cpu_agrees_with_torch_and_the_cpu_flags():
    torch_says = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert runtime.native_bf16(CPU) == torch_says
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():  # Linux: the kernel's flags name the instructions torch looks for
        flags = set(next(line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")).split())
        assert torch_says == bool(flags & {"avx512_bf16", "amx_bf16"})
    assert not runtime.native_bf16(torch.device("meta"))


def test_autocast_none_is_a_no_op_and_a_dtype_casts_matmuls():
    a = torch.randn(4, 4)
    with runtime.autocast(CPU, None):
        assert not torch.is_autocast_enabled("cpu")
        assert (a @ a).dtype == torch.float32
    with runtime.autocast(CPU, torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16


def test_cpu_has_no_peak_and_keeps_its_backend_settings():
    assert runtime.peak_flops(CPU) is None
    tf32 = torch.backends.cuda.matmul.allow_tf32
    runtime.configure(CPU)
    assert torch.backends.cuda.matmul.allow_tf32 == tf32
    tensor = torch.arange(3)
    assert torch.equal(runtime.to_device(tensor, CPU), tensor)
    runtime.sync(CPU)  # nothing to wait for, and no error


# page faults over 10 training steps of a small GPT, in a fresh process (mallopt's settings are process-wide)
FAULTS = """
import resource, sys, torch
from attnlab.runtime import keep_freed_memory
from model import GPT, GPTConfig
if sys.argv[1] == "keep":
    assert keep_freed_memory()
model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=65))
optimizer = torch.optim.AdamW(model.parameters())
x = torch.randint(65, (12, 64))
def steps(n):
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        model(x, x)[1].backward()
        optimizer.step()
        optimizer.zero_grad()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start
steps(3)
print(steps(10))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_keep_freed_memory_stops_the_training_steps_page_faulting():
    def faults(mode):
        run = subprocess.run([sys.executable, "-c", FAULTS, mode], cwd=REPO, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)
        return int(run.stdout)
    default, kept = faults("default"), faults("keep")
    assert kept * 5 < default, (kept, default)  # kept: a small fraction of the default's (docs/log.md)


def test_keep_freed_memory_declines_without_a_c_library(monkeypatch):
    monkeypatch.setattr(runtime.ctypes.util, "find_library", lambda name: "libno-such-c.so.0")
    assert runtime.keep_freed_memory() is False


# what a command's last call leaves for the collections at exit, in a fresh process (a freeze is process-wide)
EXIT = """
import gc
from attnlab.runtime import skip_exit_collections
kept = [[i] for i in range(100_000)]  # tracked objects alive at the end, as a run's are
print(skip_exit_collections(), gc.get_freeze_count())
"""


@pytest.mark.parametrize("world_size", [None, "2"])
def test_skip_exit_collections_freezes_one_process_runs_only(world_size):
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    if world_size:
        env["WORLD_SIZE"] = world_size  # as torchrun sets it
    run = subprocess.run([sys.executable, "-c", EXIT], cwd=REPO, capture_output=True, text=True, env=env, check=True)
    froze, frozen = run.stdout.split()
    if world_size:
        assert (froze, frozen) == ("False", "0")
    else:
        assert froze == "True" and int(frozen) > 100_000  # every one of them: no collection scans them again


def test_git_commit_is_this_checkouts_head():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout with git installed")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    commit = runtime.git_commit()
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and commit == head


def test_git_commit_is_none_outside_a_checkout(tmp_path):
    copy = tmp_path / "runtime.py"  # a copy of the module, which looks for its checkout next to itself
    shutil.copy(runtime.__file__, copy)
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True).returncode == 0:
        pytest.skip(f"{tmp_path} is inside a git checkout")
    spec = importlib.util.spec_from_file_location("runtime_copy", copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.git_commit() is None


@needs_cuda
def test_cuda_configure_turns_on_tf32_and_copies_without_blocking(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    runtime.configure(cuda)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert runtime.pick_device("auto").type == "cuda" and runtime.pick_device("cuda") == cuda
    moved = runtime.to_device(torch.arange(3), cuda)
    runtime.sync(cuda)
    assert moved.device.type == "cuda" and moved.tolist() == [0, 1, 2]
    assert runtime.hardware_name(cuda) == f"GPU {torch.cuda.get_device_name(cuda)}"


@needs_cuda
def test_cuda_peak_is_the_table_entry_for_this_gpu():
    name = torch.cuda.get_device_name(torch.device("cuda"))
    listed = next((flops for key, flops in runtime.PEAK_FLOPS if key in name), None)
    assert runtime.peak_flops(torch.device("cuda")) == listed


def test_a_gpu_that_emulates_bf16_does_not_count_as_native(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: asked.append(
        including_emulation) or including_emulation)  # a pre-Ampere GPU: bf16 only through emulation
    assert not runtime.native_bf16(torch.device("cuda")) and asked == [False]


def test_a_gpus_peak_is_read_from_its_whole_name():
    from attnlab.runtime import peak_of
    assert peak_of("NVIDIA L4") == 121e12 and peak_of("NVIDIA L40") == 181e12 and peak_of("NVIDIA L40S") == 362e12
    assert peak_of("NVIDIA H200") == 989e12 and peak_of("NVIDIA H200 NVL") == 835e12
    assert peak_of("NVIDIA H100 80GB HBM3") == 989e12 and peak_of("NVIDIA GeForce RTX 4090") is None

