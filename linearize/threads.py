"""CPU threads for linearize's commands, and OpenMP's wait policy on a busy machine.

torch's CPU kernels run on libgomp threads that meet at a barrier after every parallel op. By
default a thread that reaches the barrier first spins; when another process holds one of the
cores, the spinning thread burns its time slice waiting for a descheduled sibling, for each of the
thousands of small ops of a step. Measured on the 2-core build machine (docs/experiments/busy-machine):
with other busy processes ``OMP_WAIT_POLICY=PASSIVE`` (waiting threads sleep) makes a converted
MiniLM training step 1.8× faster (and up to 5× under heavier load), while on a quiet machine it
costs ~20% there and ~35% on a one-sentence latency. So linearize asks libgomp for the passive
policy when it is the one that loads torch and the machine is busy as it starts, and ``--threads``
sets the thread count explicitly.
"""

from __future__ import annotations

import os
import sys
import time

from .errors import LinearizeError
from .machine import cpu_snapshot, load_average, other_processes_cores

WAIT_POLICY = "OMP_WAIT_POLICY"


#: other processes' CPU use (cores kept busy, sampled as linearize starts) from which the machine
#: counts as busy: another process keeps about a core busy (a quiet machine reads 0.0-0.1)
BUSY_CORES = 0.75
#: how long :func:`busy_cores` samples the machine's CPU counters (the kernel counts in 10 ms ticks)
SAMPLE_SECONDS = 0.15


def prefer_passive_wait():
    """Apply :func:`wait_policy_choice` to this process (before torch loads); return the policy in
    force: ``"PASSIVE"``, the user's choice, or None (libgomp's default)."""
    choice = wait_policy_choice(os.environ, "torch" in sys.modules, busy_cores)
    if choice is not None:
        os.environ[WAIT_POLICY] = choice
    return os.environ.get(WAIT_POLICY)


def wait_policy_choice(environ, torch_loaded, busy):
    """``"PASSIVE"`` when other processes keep at least :data:`BUSY_CORES` cores busy (``busy()``,
    e.g. :func:`busy_cores`, called only when there is a choice to make), else None: libgomp's
    default spinning, which a quiet machine runs the many small ops of a converted model ~20-35%
    faster with (docs/experiments/busy-machine). None too when the user chose a policy or spin
    count in ``environ``, or torch is already loaded (libgomp read its environment then)."""
    if torch_loaded or WAIT_POLICY in environ or "GOMP_SPINCOUNT" in environ:
        return None
    cores = busy()
    return "PASSIVE" if cores is not None and cores >= BUSY_CORES else None


def busy_cores(seconds=SAMPLE_SECONDS):
    """Cores other processes keep busy now: the machine's busy CPU time over ``seconds`` (from
    ``/proc/stat``) less this process's own, while this process sleeps. Off Linux, the 1-minute
    load average.

    Not the load average on Linux: it decays over a minute, so the linearize command that just
    finished (a ``distill`` before a ``finetune``, the previous ``bench``) would read as another
    busy process for a minute after it ended, and the next command would wait passively on a
    quiet machine."""
    start = cpu_snapshot()
    if start is None:
        load = load_average()
        return None if load is None else load[0]
    time.sleep(seconds)
    return other_processes_cores(start, cpu_snapshot())


def set_threads(threads):
    """Use ``threads`` intra-op CPU threads from now on (None: keep torch's default, one per
    usable core)."""
    if threads is None:
        return
    if int(threads) < 1:
        raise LinearizeError(f"--threads must be at least 1, got {threads}")
    import torch

    torch.set_num_threads(int(threads))
