"""Where a benchmark runs (device and dtype), how its candidates are timed there, and how their
memory is measured.

- Placement: on CPU a forward is done when the call returns and PyTorch's CPU allocator is read
  through ``torch.profiler``'s memory events (:func:`peak_extra_memory`). On CUDA kernels run
  asynchronously, so every timed call is bracketed by ``torch.cuda.synchronize()``, and peak
  memory is ``torch.cuda.max_memory_allocated()`` during the call minus what was allocated before it.
- Latency: wall-clock ``time.perf_counter`` (or, ``clock="cpu"``, the process's CPU time) of one
  call, ``warmup`` untimed rounds then ``repeats`` timed rounds. Every round runs every candidate
  once, in an order rotated each round, so machine drift and neighbours' load hit all candidates
  alike (:func:`interleaved_times`). Reported: the median (and min/max) per candidate, and ratios
  against a reference (:func:`measure_candidates`).
- Peak memory: the extra memory PyTorch's CPU allocator hands out during one call, output
  included, inputs and weights excluded: ``torch.profiler`` with ``profile_memory=True`` records
  every allocation and free; the peak of their running sum is reported. Memory that bypasses
  ATen's allocator (oneDNN/BLAS scratch, thread stacks) and allocator fragmentation are not
  counted. A separate, untimed call is profiled, so profiling overhead never enters latency. The
  code is :mod:`linearize.bench.peak_memory`'s, which the user's-state processes run too.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass

import torch

from ..errors import LinearizeError
from ..machine import busy_warning, cpu_snapshot, machine_info, other_processes_cores, rounded_load_average
from ..threads import set_threads
from .peak_memory import peak_extra_bytes

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: what a latency is measured with: wall clock, or the process's CPU time (with one thread, the time
#: the forward itself computed, whatever other processes take from the machine meanwhile)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


# ---- placement -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """A device (``cpu``, ``cuda``, ``cuda:1``), a dtype name (``fp32``, ``bf16``, ``fp16``) and a
    clock (``wall``, or ``cpu``: the process's CPU time)."""

    device: str = "cpu"
    dtype: str = "fp32"
    clock: str = "wall"

    @classmethod
    def parse(cls, device="cpu", dtype="fp32", clock="wall"):
        """A checked placement: a one-line error for a device this machine lacks, a dtype it cannot
        run or an unknown clock."""
        device, dtype = str(device or "cpu").lower(), str(dtype or "fp32").lower()
        if clock not in CLOCKS:
            raise LinearizeError(f"unknown clock {clock!r}; use one of: {', '.join(CLOCKS)}")
        if dtype not in DTYPES:
            raise LinearizeError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        kind = device.split(":")[0]
        if kind not in ("cpu", "cuda"):
            raise LinearizeError(f"--device {device!r} is not cpu or cuda (cuda:N for another GPU)")
        if kind == "cuda" and not torch.cuda.is_available():
            raise LinearizeError("--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is False); "
                                 "use --device cpu")
        if kind == "cpu" and dtype == "fp16":
            raise LinearizeError("--dtype fp16 needs --device cuda (CPU kernels in fp16 are slow emulations); use "
                                 "bf16 or fp32 on CPU")
        if kind == "cuda" and clock == "cpu":
            raise LinearizeError("--clock cpu counts this process's CPU time, not the GPU's: use the wall clock on cuda")
        return cls(device, dtype, clock)

    @property
    def is_cuda(self):
        return self.device.startswith("cuda")

    @property
    def torch_dtype(self):
        return DTYPES[self.dtype]

    def now(self):
        """The clock's reading in seconds."""
        return CLOCKS[self.clock]()

    def synchronize(self):
        """Wait for the device's queued kernels (nothing to wait for on CPU)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def tensor(self, tensor):
        """A float tensor on this device in this dtype."""
        return tensor.to(self.device, self.torch_dtype)

    def model(self, module):
        """``module`` moved to this device and cast to this dtype (in place, returned)."""
        return module.to(self.device, self.torch_dtype)

    def batch(self, batch):
        """Model inputs on this device (token ids and masks keep their integer dtype)."""
        return {key: value.to(self.device) for key, value in batch.items()}

    def memory_bytes(self):
        """The device's memory: the GPU's total, or None on CPU (the caller reads the machine's)."""
        if self.is_cuda:
            return int(torch.cuda.get_device_properties(self.device).total_memory)
        return None

    def record(self):
        """What a benchmark's ``config`` records of the placement."""
        return {"device": self.device, "dtype": str(self.torch_dtype).replace("torch.", ""),
                "placement": self.describe(), "clock": self.clock}

    def describe(self):
        """``"cpu, float32"`` or ``"cuda (NVIDIA H100 80GB HBM3), bfloat16"``."""
        name = f"cuda ({torch.cuda.get_device_name(self.device)})" if self.is_cuda else self.device
        return f"{name}, {str(self.torch_dtype).replace('torch.', '')}"


CPU = Placement()


def checked_placement(measure):
    """The :class:`Placement` of a :class:`linearize.config.MeasureConfig`, the settings checked
    first: a bad device, dtype or clock is :meth:`Placement.parse`'s one line, any other bad
    setting :meth:`MeasureConfig.check <linearize.config.Config.check>`'s."""
    placement = Placement.parse(measure.device, measure.dtype, measure.clock)
    measure.check()
    return placement


def loop_settings(measure):
    """A :class:`linearize.config.MeasureConfig`'s settings that the in-process timing loops take
    as keywords (:func:`linearize.bench.bench_attention`, :func:`linearize.bench.bench_model`,
    :func:`linearize.bench.measure_lengths`)."""
    return {"batch_size": measure.batch_size, "repeats": measure.repeats, "warmup": measure.warmup,
            "memory": measure.memory}


# ---- the machine during a run ----------------------------------------------------------------------

@contextlib.contextmanager
def measuring(threads=None):
    """Set torch's threads for a run (restored after) and yield the machine record
    (:func:`linearize.machine.machine_info`), which gains the load at the end and how busy other
    processes kept the CPU."""
    saved = torch.get_num_threads()
    set_threads(threads)
    try:
        machine = machine_info()
        snapshot = cpu_snapshot()
        yield machine
        machine["load_average_end"] = rounded_load_average()
        machine["other_processes_cores"] = other_processes_cores(snapshot, cpu_snapshot())
        machine["busy_warning"] = busy_warning(machine["other_processes_cores"], machine.get("usable_cores"))
    finally:
        torch.set_num_threads(saved)


# ---- time and memory of one call ---------------------------------------------------------------------

def _timed(fn, placement=CPU):
    placement.synchronize()  # CUDA: earlier kernels are not this call's time
    start = placement.now()
    out = fn()
    placement.synchronize()  # CUDA: the call's kernels are queued, not done, when it returns
    elapsed = placement.now() - start
    del out
    return elapsed


def peak_extra_memory(fn, placement=CPU):
    """Peak bytes allocated while ``fn()`` runs, output included, allocations live before the call
    (inputs, weights) not counted (:mod:`linearize.bench.peak_memory`: PyTorch's CPU allocator through
    ``torch.profiler``'s memory events; on CUDA the device allocator's peak above the bytes allocated before)."""
    return peak_extra_bytes(fn, torch.device(placement.device))


# ---- candidates side by side -------------------------------------------------------------------------

def _summary(seconds):
    ms = sorted(s * 1e3 for s in seconds)
    return {"median_ms": statistics.median(ms), "min_ms": ms[0], "max_ms": ms[-1], "runs": len(ms)}


def interleaved_times(candidates, repeats, warmup, placement=CPU):
    """Time every candidate ``warmup + repeats`` rounds, all candidates once per round, in an order
    rotated each round; return ``{label: [seconds of the timed rounds]}``."""
    labels = list(candidates)
    times = {label: [] for label in labels}
    for round_index in range(warmup + repeats):
        shift = round_index % max(len(labels), 1)
        for label in labels[shift:] + labels[:shift]:
            elapsed = _timed(candidates[label], placement)
            if round_index >= warmup:
                times[label].append(elapsed)
    return times


def measure_candidates(candidates, repeats, warmup, memory, reference, ratio_key, placement=CPU):
    """``{label: summary}`` of interleaved timings (and peak memory) of ``{label: call}``, each
    time ÷ ``reference``'s under ``ratio_key``: ``median_ms``, ``min_ms``, ``max_ms``, ``runs``
    (and ``peak_extra_bytes`` with ``memory``)."""
    with torch.inference_mode():
        times = interleaved_times(candidates, repeats, warmup, placement)
        peaks = {label: peak_extra_memory(fn, placement) for label, fn in candidates.items()} if memory else {}
    results = {}
    for label in candidates:
        entry = _summary(times[label])
        if memory:
            entry["peak_extra_bytes"] = peaks[label]
        results[label] = entry
    if reference in results:  # a reference skipped at this length (memory cap): no ratios
        base = results[reference]["median_ms"]
        for entry in results.values():
            entry[ratio_key] = entry["median_ms"] / base
    return results
