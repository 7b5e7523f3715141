"""scripts/timing.py, the timing kit of the bench and the report: the machine's name, A B A B alternation, training
steps timed alike, peak memory against allocations of known size, a deadline from the process's start. No wall-clock
asserts."""
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO

import scripts.timing as timing
from model import manual_attention

CPU = torch.device("cpu")


def test_hardware_name_names_the_cpu_its_capability_and_threads(one_thread):
    name = timing.hardware_name(CPU)
    assert name.startswith("CPU ") and name.endswith(", 1 thread(s)")
    assert f"torch capability {torch.backends.cpu.get_cpu_capability()}" in name
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
              if line.startswith("model name")]
    if models:
        assert models[0] in name


def test_alternate_calls_each_function_in_turn_and_returns_its_median(monkeypatch):
    now, calls = [0.0], []
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    def work(name, seconds):
        def fn():
            calls.append(name)
            now[0] += seconds.pop(0)
        return fn

    medians = timing.alternate({"A": work("A", [1.0, 5.0, 2.0]), "B": work("B", [30.0, 10.0, 20.0])}, 3, CPU)
    assert calls == ["A", "B", "A", "B", "A", "B"]
    assert medians == {"A": 2.0, "B": 20.0}


def test_a_deadline_counts_from_the_processs_start():
    # a fresh interpreter that sleeps before asking: its age includes the sleep, as the GPU check's includes imports
    code = "import time; time.sleep(0.5); from scripts.timing import process_age_s; print(process_age_s())"
    age = float(subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                               check=True).stdout)
    assert 0.5 <= age < 60


def test_peak_bytes_sees_a_known_allocation():
    n = 10_000_000

    def allocate():
        block = torch.ones(n, dtype=torch.uint8)
        del block
        torch.ones(n // 2, dtype=torch.uint8)  # after the first is freed: the peak is the larger one, not the sum

    assert n <= timing.peak_bytes(allocate, CPU) < 1.5 * n


def test_peak_bytes_sees_the_weights_that_manual_attention_holds_and_fused_attention_does_not():
    T, heads = 1024, 4
    q, k, v = (torch.randn(1, heads, T, 64, requires_grad=True) for _ in range(3))
    weights = heads * T * T * 4  # (B, nh, T, T) in fp32
    manual = timing.peak_bytes(lambda: manual_attention(q, k, v, None, True)[0].sum().backward(), CPU)
    q.grad = k.grad = v.grad = None
    fused = timing.peak_bytes(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward(), CPU)
    assert manual >= 2 * weights > weights > fused  # scores and weights, against O(T) buffers


def test_time_steps_warms_up_sizes_the_calls_and_gives_seconds_per_step(monkeypatch):
    calls = []
    monkeypatch.setattr(timing, "seconds_of", lambda fn, device: fn() or 0.01)  # every call "takes" 10 ms
    seconds = timing.time_steps({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3, CPU, warmup=2,
                                 call_s=0.05)
    assert calls.count("a") == calls.count("b") == 2 + 1 + 3 * 5  # warm-up, the sizing step, 3 calls of 5 steps
    assert seconds == {"a": [pytest.approx(0.002)] * 3, "b": [pytest.approx(0.002)] * 3}
    assert calls[-10:] == ["a"] * 5 + ["b"] * 5  # the last round: a's call, then b's
