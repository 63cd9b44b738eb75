"""CPU threads and OpenMP's wait policy (linearize/threads.py; docs/experiments/busy-machine)."""

import os
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from linearize.cli import app
from linearize.errors import LinearizeError
from linearize.machine import cpu_snapshot, other_processes_cores
from linearize.threads import BUSY_CORES, busy_cores, set_threads, wait_policy_choice

POLICY = "import os, sys; {first}; print(os.environ.get('OMP_WAIT_POLICY'))"


def policy_after(first, **env):
    environment = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run([sys.executable, "-c", POLICY.format(first=first)], env={**environment, **env},
                          capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def test_a_busy_machine_gets_passive_waiting_and_a_quiet_one_libgomps_default():
    assert wait_policy_choice({}, torch_loaded=False, busy=lambda: BUSY_CORES) == "PASSIVE"
    assert wait_policy_choice({}, torch_loaded=False, busy=lambda: 0.1) is None
    assert wait_policy_choice({}, torch_loaded=False, busy=lambda: None) is None  # unknown: the default

    def must_not_sample():
        raise AssertionError("the machine was sampled although there was nothing to choose")

    # the user's choice, and a torch loaded before linearize (libgomp has read its environment), win
    assert wait_policy_choice({"OMP_WAIT_POLICY": "ACTIVE"}, torch_loaded=False, busy=must_not_sample) is None
    assert wait_policy_choice({"GOMP_SPINCOUNT": "10000"}, torch_loaded=False, busy=must_not_sample) is None
    assert wait_policy_choice({}, torch_loaded=True, busy=must_not_sample) is None


def test_other_processes_cores_leaves_out_this_processs_own_cpu_time():
    # snapshots are (wall s, machine busy CPU s, this process's CPU s): over 2 s the machine was
    # busy 3 CPU s, 1 of them this process's, so others kept 1 core busy
    assert other_processes_cores((10.0, 100.0, 5.0), (12.0, 103.0, 6.0)) == 1.0
    assert other_processes_cores((10.0, 100.0, 5.0), (12.0, 101.0, 7.0)) == 0.0  # tick rounding: never negative
    assert other_processes_cores(None, (12.0, 101.0, 7.0)) is None


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="samples Linux's /proc/stat")
def test_busy_cores_samples_the_machine_now():
    cores = busy_cores(0.05)
    assert 0.0 <= cores <= os.cpu_count() + 0.5  # the kernel counts in ticks: allow rounding


def test_importing_linearize_keeps_the_users_policy_and_leaves_a_loaded_torch_alone():
    assert policy_after("import linearize", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    assert policy_after("import torch, linearize") == "None"


def test_set_threads_sets_torchs_thread_count_and_refuses_zero():
    saved = torch.get_num_threads()
    try:
        set_threads(1)
        assert torch.get_num_threads() == 1
        set_threads(None)  # keeps the count
        assert torch.get_num_threads() == 1
        with pytest.raises(LinearizeError, match="--threads must be at least 1"):
            set_threads(0)
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("command", [["distill"], ["finetune"], ["run"], ["compare"], ["bench", "attention"],
                                     ["bench", "long"], ["bench", "folder"], ["eval", "text"], ["eval", "glue"],
                                     ["eval", "image"]])
def test_the_training_evaluation_and_bench_commands_take_threads(command):
    done = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert done.exit_code == 0 and "--threads" in done.output


def test_zero_threads_is_a_one_line_error():
    done = CliRunner().invoke(app, ["run", "--quick", "--threads", "0"])
    assert done.exit_code == 1
    assert "--threads must be at least 1" in done.output and "Traceback" not in done.output
