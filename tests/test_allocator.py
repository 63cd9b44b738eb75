"""glibc's malloc kept from handing freed blocks back (linearize/allocator.py)."""

import json
import os
import subprocess
import sys

import pytest

from linearize.allocator import _reason_to_stand_aside

FAULTS = """
import json, resource, sys
import torch
from linearize import allocator
state = allocator.keep_freed_memory() if sys.argv[1] == "keep" else allocator.state
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
x = torch.ones(12 * 2**20)  # 48 MiB: above the most glibc's own mmap threshold rises to (32 MiB)
for _ in range(3):
    (x * 2).sum()
per_step = []
for _ in range(21):
    start = faults()
    (x * 2).sum()  # a 48 MiB temporary, allocated and freed each time
    per_step.append(faults() - start)
print(json.dumps({"state": state, "faults_per_step": sorted(per_step)[10]}))  # the median step
"""


def faults_per_step(mode, **env):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", FAULTS, mode], env={**environment, **env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(_reason_to_stand_aside({}) is not None, reason="glibc on Linux only")
def test_kept_freed_memory_is_not_faulted_in_again_at_every_step():
    default, kept = faults_per_step("default"), faults_per_step("keep")
    assert default["state"] == "glibc default" and kept["state"].startswith("glibc, freed blocks up to 1024 MiB kept")
    # glibc's default maps a fresh 48 MiB (12,288 pages) for the temporary each step; kept, the heap
    # serves it again (a step now and then still faults it anew: the median step is compared)
    assert default["faults_per_step"] > 6000
    assert kept["faults_per_step"] < 100


def test_the_users_allocator_choice_wins():
    assert _reason_to_stand_aside({"MALLOC_TRIM_THRESHOLD_": "0"}) == "user's glibc malloc settings"
    assert _reason_to_stand_aside({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1"}) == "user's glibc malloc settings"
    assert _reason_to_stand_aside({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}) == "preloaded jemalloc"


@pytest.mark.skipif(_reason_to_stand_aside({}) is not None, reason="glibc on Linux only")
def test_the_linearize_command_keeps_freed_memory_and_the_library_import_does_not():
    code = ("import sys; from linearize import allocator; from linearize.cli import main; "
            "sys.argv = ['linearize', 'methods']\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(allocator.state)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1].startswith("glibc, freed blocks")
    done = subprocess.run([sys.executable, "-c", "from linearize import allocator; print(allocator.state)"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "glibc default"
