"""The timing kit of scripts/bench.py and scripts/report: A B A B alternation, training steps and one layer timed
alike, peak memory, decoding per token, a deadline, and the machine's name for every figure."""
import os
import platform
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from attnlab.decode import generate_stream
from attnlab.runtime import sync


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
    reserve; past the end nothing fits, however small."""

    def __init__(self, seconds, clock=time.monotonic):
        self.clock, self.end = clock, clock() + seconds

    def left(self):
        return self.end - self.clock()

    def fits(self, predicted_s, reserve_s=0.0):
        return self.left() > 0 and predicted_s + reserve_s <= self.left()


def seconds_of(fn, device):
    """The wall time of one call of fn, its device work included."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


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


def time_steps(steps, rounds, device, warmup=1, call_s=0.0):
    """Seconds per training step of each of steps (name: a function that takes one step), one figure per round:
    warmup steps first (the allocator, the optimizer's state, compilation), then one more timed to size the calls,
    each call as many steps as fill call_s (one at least), the calls in alternating rounds."""
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


def forward_backward(layer, x, grad):
    """One layer's forward and backward; the gradients are dropped after, so every call starts from the same memory."""
    y = layer(x)
    if isinstance(y, tuple):
        y = y[0]  # an LSTM's (output, state)
    y.backward(grad)
    layer.zero_grad(set_to_none=True)
    x.grad = None


def layer_costs(layers, lengths, width, rounds, device, memory_cap=float("inf"), time_cap_s=float("inf")):
    """Median seconds and peak bytes of each layer's forward and backward on a (1, T, width) input at every T of
    lengths, the layers alternating; a layer stops where growth as T² from its last point predicts more than
    memory_cap bytes or time_cap_s seconds a call. Returns seconds and memory {name: {T: value}} and the skipped
    {name: (T, why)}."""
    seconds, memory, skipped = {name: {} for name in layers}, {name: {} for name in layers}, {}
    caps = ((memory, memory_cap, f"peak over {memory_cap / 2**30:g} GiB"),
            (seconds, time_cap_s, f"over {time_cap_s:g} s per call"))
    for T in lengths:
        for name in set(layers) - set(skipped):
            why = next((why for values, cap, why in caps if grows_past(values[name], T, cap)), None)
            if why:
                skipped[name] = (T, why)
        x = torch.randn(1, T, width, device=device, requires_grad=True)
        grad = torch.randn(1, T, width, device=device)
        fns = {name: partial(forward_backward, layer, x, grad) for name, layer in layers.items() if name not in skipped}
        for fn in fns.values():
            fn()  # warm-up
        for name, s in alternate(fns, rounds, device).items():
            seconds[name][T], memory[name][T] = s, peak_bytes(fns[name], device)
    return seconds, memory, skipped


def grows_past(values, T, cap):
    """Whether values ({length: measure}) would pass cap at length T, growing as T² from their last point."""
    last = max(values, default=None)
    return last is not None and values[last] * (T / last) ** 2 > cap


def token_times(model, prompt, new_tokens, kv_cache, device, generator=None):
    """Seconds for each new token that generate_stream yields after prompt (the first includes reading it)."""
    times, last = [], time.perf_counter()
    for _ in generate_stream(model, prompt, new_tokens, kv_cache=kv_cache, generator=generator):
        sync(device)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times
