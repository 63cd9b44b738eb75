"""Peak extra memory of one call, with PyTorch alone (no other linearize module).

The fresh processes of :mod:`linearize.bench.user_state` cannot import linearize (they are a user's
process), so they load this file by its path; ``linearize bench`` imports it as a module. One
implementation serves both, so a figure means the same wherever it was measured:

- CPU: the bytes PyTorch's CPU allocator hands out during the call, output included, inputs and
  weights excluded: ``torch.profiler`` with ``profile_memory=True`` records every allocation and free,
  and the peak of their running sum is the figure. Memory that bypasses ATen's allocator (oneDNN/BLAS
  scratch, thread stacks) and the allocator's fragmentation are not counted, so the figure does not
  depend on the process's malloc settings.
- CUDA: ``torch.cuda.max_memory_allocated()`` during the call minus what was allocated before it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile

import torch


@contextlib.contextmanager
def quiet_stderr():
    """Silence the profiler backend's C++ log lines (written straight to file descriptor 2)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def memory_events(prof):
    """``[(time, bytes)]`` of the CPU allocations (+) and frees (-) a profile recorded."""
    try:
        events = prof.profiler.kineto_results.events()
        found = [(e.start_ns(), e.nbytes()) for e in events
                 if e.name() == "[memory]" and "CPU" in str(e.device_type())]
        if found or not events:
            return found
    except (AttributeError, RuntimeError):
        pass
    with tempfile.TemporaryDirectory() as tmp:  # fall back on the exported trace
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as handle:
            trace = json.load(handle)
    return [(e.get("ts", 0), e["args"]["Bytes"]) for e in trace.get("traceEvents", [])
            if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0]


def cpu_peak_extra_bytes(fn):
    """Peak bytes PyTorch's CPU allocator hands out while ``fn()`` runs (its output included)."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn()
            del out
    running = peak = 0
    for _, nbytes in sorted(memory_events(prof), key=lambda item: item[0]):
        running += nbytes
        peak = max(peak, running)
    return int(peak)


def cuda_peak_extra_bytes(fn, device):
    """The peak bytes allocated on CUDA ``device`` while ``fn()`` runs, above what was allocated before
    (its output included)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    return int(peak)


def peak_extra_bytes(fn, device):
    """:func:`cuda_peak_extra_bytes` on a CUDA ``device`` (a ``torch.device``), else :func:`cpu_peak_extra_bytes`."""
    return cuda_peak_extra_bytes(fn, device) if device.type == "cuda" else cpu_peak_extra_bytes(fn)
