"""Facts about the machine linearize runs on, read in one place."""

from __future__ import annotations

import os


def physical_memory():
    """This machine's memory in bytes (the kernel's total RAM, ``MemTotal`` on Linux), or None where
    the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
