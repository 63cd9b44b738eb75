"""The ``linearize`` command, killed (SIGKILL, every process) right after a given checkpoint.

Usage: ``python -m torch.distributed.run --nproc_per_node 2 --standalone tests/killed_cli.py
FOLDER STEP linearize-arguments...``: the processes run ``linearize linearize-arguments...`` and
kill themselves as soon as the checkpoint of optimizer step ``STEP`` in a checkpoint folder named
``FOLDER`` is complete (stage 1: ``stage1_state.pt``; stage 2: ``accelerator.save_state``), as a
preempted job would be. For tests/test_distributed_cli.py.
"""

import os
import signal
import sys
from pathlib import Path

import linearize.distill.stage1 as stage1
import linearize.finetune.stage2 as stage2
from linearize.cli import main

FOLDER, STEP = sys.argv[1], int(sys.argv[2])
save_stage1, save_stage2 = stage1._save_state, stage2.save_accelerator_checkpoint


def kill_at(folder, step):
    if Path(folder).name == FOLDER and step == STEP:
        os.kill(os.getpid(), signal.SIGKILL)


def stage1_then_kill(path, maps, optimizer, scheduler, step, *args):
    save_stage1(path, maps, optimizer, scheduler, step, *args)
    kill_at(Path(path).parent, step)


def stage2_then_kill(accelerator, output_dir, progress):
    save_stage2(accelerator, output_dir, progress)
    kill_at(output_dir, progress["step"])


stage1._save_state, stage2.save_accelerator_checkpoint = stage1_then_kill, stage2_then_kill
sys.argv = ["linearize", *sys.argv[3:]]
main()
