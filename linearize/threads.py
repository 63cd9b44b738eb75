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

from .errors import LinearizeError

WAIT_POLICY = "OMP_WAIT_POLICY"


#: the 1-minute load average from which the machine counts as busy: another process kept about a
#: core busy (a quiet machine reads 0.0-0.3)
BUSY_LOAD = 0.75


def prefer_passive_wait():
    """Apply :func:`wait_policy_choice` to this process (before torch loads); return the policy in
    force: ``"PASSIVE"``, the user's choice, or None (libgomp's default)."""
    choice = wait_policy_choice(os.environ, "torch" in sys.modules, _load_average())
    if choice is not None:
        os.environ[WAIT_POLICY] = choice
    return os.environ.get(WAIT_POLICY)


def wait_policy_choice(environ, torch_loaded, load):
    """``"PASSIVE"`` when the machine is busy (a 1-minute ``load`` average of at least
    :data:`BUSY_LOAD`), else None: libgomp's default spinning, which a quiet machine runs the many
    small ops of a converted model ~20-35% faster with (docs/experiments/busy-machine). None too
    when the user chose a policy or spin count in ``environ``, or torch is already loaded (libgomp
    read its environment then)."""
    if torch_loaded or WAIT_POLICY in environ or "GOMP_SPINCOUNT" in environ:
        return None
    return "PASSIVE" if load >= BUSY_LOAD else None


def _load_average():
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on this platform
        return 0.0


def set_threads(threads):
    """Use ``threads`` intra-op CPU threads from now on (None: keep torch's default, one per
    usable core)."""
    if threads is None:
        return
    if int(threads) < 1:
        raise LinearizeError(f"--threads must be at least 1, got {threads}")
    import torch

    torch.set_num_threads(int(threads))
