"""The ``linearize`` command, killed (SIGKILL, every process) right after a given checkpoint.

Usage: ``python -m torch.distributed.run --nproc_per_node 2 --standalone tests/killed_cli.py
FOLDER STEP linearize-arguments...``: the processes run ``linearize linearize-arguments...`` and
kill themselves as soon as the checkpoint of optimizer step ``STEP`` in a checkpoint folder named
``FOLDER`` is complete (``Trainer.save_checkpoint``, both stages), as a preempted job would be.
For tests/test_distributed_cli.py.
"""

import os
import signal
import sys
from pathlib import Path

from linearize.cli import main
from linearize.training import Trainer

FOLDER, STEP = sys.argv[1], int(sys.argv[2])
save_checkpoint = Trainer.save_checkpoint


def save_then_kill(trainer, directory, **progress):
    """``Trainer.save_checkpoint``, then SIGKILL when it was step ``STEP``'s in a folder named ``FOLDER``."""
    save_checkpoint(trainer, directory, **progress)
    if Path(directory).name == FOLDER and progress["step"] == STEP:
        os.kill(os.getpid(), signal.SIGKILL)


Trainer.save_checkpoint = save_then_kill
sys.argv = ["linearize", *sys.argv[3:]]
main()
