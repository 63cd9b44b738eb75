"""How many processes a launcher started, read from its environment without loading torch (the
command line asks before it knows whether a command needs torch)."""

from __future__ import annotations

import os

#: the environment variables a launcher sets to the number of processes (torchrun and accelerate
#: launch set WORLD_SIZE; MPI launchers their own), as accelerate reads them
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launched_processes():
    """How many processes the launcher started (1 without a launcher)."""
    return max([int(os.environ.get(name, "1") or 1) for name in WORLD_SIZE_VARIABLES])
