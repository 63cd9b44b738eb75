"""glibc's malloc in a ``linearize`` command: keep freed memory for the next step.

PyTorch's CPU tensors come from the C library's ``malloc``. glibc serves a block larger than its
mmap threshold (128 KiB at first, raised as such blocks are freed, up to 32 MiB) with a fresh
``mmap`` and gives it back with ``munmap`` when it is freed, and it trims the top of its heap
back to the system once more than the trim threshold is free there. A model's activations are
such blocks, allocated and freed again in every forward and backward pass, so every step asks
the kernel for the same pages again and takes a page fault (and a page of zeroing) for each
4 KiB: 6-10 thousand faults per all-MiniLM-L6-v2 forward at batch 8 × 128 tokens, 14-53
thousand per training step at 32 × 64, and 4-9% of the time (docs/experiments/cpu-allocator).

:func:`keep_freed_memory` raises both thresholds to :data:`KEEP_BYTES`: blocks up to that size
come from the heap and stay there when freed, ready for the next step. The process keeps its peak
memory instead of giving it back between steps (measured: the same peak resident memory) as
long as its big blocks come in a few repeated sizes: blocks of hundreds of MiB whose size changes
every step fragment the kept heap (stage 1 over 805 MB blocks of varying length: 19.9 GiB peak
against 5.5; docs/experiments/cpu-allocator), which is why stage 1 keeps its blocks under 64 MiB. The
``linearize`` command applies it as it starts; ``import linearize`` does not (a library leaves its
host process's allocator alone). It stands aside where the user chose: glibc's own ``MALLOC_*``
environment variables or ``GLIBC_TUNABLES``, or another allocator preloaded (jemalloc, tcmalloc,
mimalloc), and off glibc.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: blocks up to this size stay in the heap when freed (glibc's mmap and trim thresholds)
KEEP_BYTES = 2**30
#: mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

#: what :func:`keep_freed_memory` did in this process (recorded by ``linearize bench``)
state = "glibc default"


def keep_freed_memory(environ=None):
    """Raise glibc's mmap and trim thresholds to :data:`KEEP_BYTES` in this process (see the module
    docstring); return the allocator state (also kept in :data:`state`): ``"glibc, freed blocks up
    to 1024 MiB kept ..."``, or why not (``"user's glibc malloc settings"``, ``"preloaded jemalloc"``,
    ``"not glibc"``, ``"glibc refused mallopt"``)."""
    global state
    environ = os.environ if environ is None else environ
    reason = _reason_to_stand_aside(environ)
    if reason is not None:
        state = reason
        return state
    libc = ctypes.CDLL(None)
    if libc.mallopt(M_MMAP_THRESHOLD, KEEP_BYTES) != 1 or libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES) != 1:
        state = "glibc refused mallopt"
        return state
    state = f"glibc, freed blocks up to {KEEP_BYTES // 2**20} MiB kept (mmap and trim thresholds)"
    return state


def _reason_to_stand_aside(environ):
    if any(name in environ for name in USER_SETTINGS) or "glibc.malloc" in environ.get("GLIBC_TUNABLES", ""):
        return "user's glibc malloc settings"
    preloaded = environ.get("LD_PRELOAD", "")
    for name in OTHER_ALLOCATORS:
        if name in preloaded:
            return f"preloaded {name}"
    if not sys.platform.startswith("linux") or not _is_glibc():
        return "not glibc"
    return None


def _is_glibc():
    try:
        return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
    except OSError:
        return False
