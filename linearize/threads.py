"""CPU threads for linearize's commands, and OpenMP's wait policy on a busy machine.

torch's CPU kernels run on libgomp threads that meet at a barrier after every parallel op. By
default a thread that reaches the barrier first spins; when another process holds one of the
cores, the spinning thread burns its time slice waiting for a descheduled sibling, for each of the
thousands of small ops of a step. Measured on the 2-core build machine with one other busy process
(docs/experiments/busy-machine): ``OMP_WAIT_POLICY=PASSIVE`` (waiting threads sleep) brings a
converted MiniLM training step and a one-sentence latency back near their idle values, while one
thread only halves the damage. So linearize asks libgomp for the passive policy whenever it is the
one that loads torch, and ``--threads`` sets the thread count explicitly.
"""

from __future__ import annotations

import os
import sys

from .errors import LinearizeError

WAIT_POLICY = "OMP_WAIT_POLICY"


def prefer_passive_wait():
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process and its children, unless the user chose a
    policy or torch is already loaded (libgomp reads the variable once, when torch loads it).

    Returns the policy in force for this process: ``"PASSIVE"``, the user's choice, or None where
    torch was loaded first with libgomp's default."""
    if "torch" in sys.modules:
        return os.environ.get(WAIT_POLICY)
    return os.environ.setdefault(WAIT_POLICY, "PASSIVE")


def set_threads(threads):
    """Use ``threads`` intra-op CPU threads from now on (None: keep torch's default, one per
    usable core)."""
    if threads is None:
        return
    if int(threads) < 1:
        raise LinearizeError(f"--threads must be at least 1, got {threads}")
    import torch

    torch.set_num_threads(int(threads))
