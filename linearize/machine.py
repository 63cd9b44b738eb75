"""Facts about the machine linearize runs on, read in one place: its CPU, cores, memory, load and
CPU counters, and the torch build and threads a measurement ran with (:func:`machine_info`).

Imports nothing heavy: :mod:`linearize.threads` reads the CPU counters here before torch loads.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def physical_memory():
    """This machine's memory in bytes (the kernel's total RAM, ``MemTotal`` on Linux), or None where
    the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def cpu_model():
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def logical_cores():
    """The machine's logical cores (``os.cpu_count()``), or None where the system does not say."""
    return os.cpu_count()


def usable_cores():
    """The cores this process may run on (its CPU affinity; all logical cores where the system has
    no affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def load_average():
    """The 1-, 5- and 15-minute load averages, or None where the system does not say."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):  # not on this platform
        return None


def cpu_snapshot():
    """``(wall s, CPU s busy on the whole machine, CPU s of this process and its finished children)`` or None
    off Linux."""
    try:
        import resource  # not on Windows, where ``import linearize`` must still work

        with open("/proc/stat") as stat:
            fields = [float(x) for x in stat.readline().split()[1:]]
        ticks = os.sysconf("SC_CLK_TCK")
    except (ImportError, OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # a benchmark's measuring processes are its own work
    return (time.monotonic(), (sum(fields[:8]) - idle) / ticks,
            own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime)


def other_processes_cores(start, end):
    """Average number of cores other processes kept busy between two :func:`cpu_snapshot`."""
    if start is None or end is None or end[0] <= start[0]:
        return None
    other = (end[1] - start[1]) - (end[2] - start[2])
    return round(max(other, 0.0) / (end[0] - start[0]), 3)


#: other processes' CPU (cores, on average) from which a timing is flagged as inflated
BUSY_CORES = 0.15


def busy_warning(other_cores, usable=None):
    """A note when other processes kept at least :data:`BUSY_CORES` cores busy during a timing (``other_cores``:
    :func:`other_processes_cores`), else None: intra-op threads then wait on descheduled siblings and every
    timing inflates, the many-small-op linear paths far more than single-kernel SDPA."""
    if other_cores is None or other_cores < BUSY_CORES:
        return None
    of = f" of {usable}" if usable else ""
    return (f"other processes kept {other_cores:.2f}{of} cores busy on average during the timings: they are inflated "
            "and unreliable; rerun on an idle machine")


def machine_info():
    """CPU model, cores, memory, torch build and threads, load average (what a benchmark records)."""
    import torch

    from . import allocator

    memory = physical_memory()
    return {
        "cpu_model": cpu_model() or platform.processor() or platform.machine(),
        "logical_cores": logical_cores(),
        "usable_cores": usable_cores(),
        "memory_gib": round(memory / 2**30, 1) if memory else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "libgomp default"),
        "malloc": allocator.state,
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
        "mkl": bool(torch.backends.mkl.is_available()),
        "load_average_start": rounded_load_average(),
    }


def rounded_load_average():
    """:func:`load_average` rounded to two decimals, as a list (None where the system does not say)."""
    load = load_average()
    return None if load is None else [round(x, 2) for x in load]


def environment():
    """Versions, platform, CPU, threads and allocator state of the process a run measured in (the
    report's ``environment``)."""
    import torch
    import transformers

    from . import allocator
    from .version import __version__

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "linearize": __version__, "platform": platform.platform(), "cpu": cpu_model(),
            "threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "libgomp default"),
            "malloc": allocator.state}
