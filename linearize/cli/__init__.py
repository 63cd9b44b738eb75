"""The ``linearize`` command line: it parses arguments and calls the library, nothing more.

One module per noun (``convert.py``: convert, info, methods; ...), each registering its
commands on the shared ``app``; the option aliases shared by several commands live here.

Every error a user can cause (``LinearizeError``, a bad path they gave, a bad option value) is
printed as one line (``error: ...``) with a non-zero exit; any other exception is a bug and keeps
its traceback. Set ``LINEARIZE_DEBUG=1`` to see the traceback of the one-liners too.
"""

from __future__ import annotations

import logging
import os
import sys

from ..allocator import keep_freed_memory
from .common import (  # noqa: F401  (the package's API: linearize.cli.app, the shared options)
    HeadDimOpt,
    LayersOpt,
    MethodOpt,
    NumHeadsOpt,
    OptionOpt,
    PATH_ERRORS,
    TEXT_DATA_FIELDS,
    TaskOpt,
    ThreadsOpt,
    TrainFileOpt,
    app,
    console,
    debug_enabled,
    err_console,
    friendly_errors,
    is_user_path_error,
    parse_layers,
    print_scores,
    root,
    set_threads,
)


def main():
    keep_freed_memory()  # the command's steps reuse their freed memory: see linearize/allocator.py
    succeeded = False
    try:
        app()
        succeeded = True
    except SystemExit as done:
        succeeded = done.code in (None, 0)
        raise
    finally:
        leave_process_group(succeeded)


def leave_process_group(succeeded):
    """Under ``torchrun`` / ``accelerate launch``: meet the other processes (after a success
    only: a failed process must not wait for ones that may never come) and destroy the process
    group before the interpreter exits. Left to the interpreter's shutdown, a gloo group can
    abort a process that has finished its work ("terminate called without an active
    exception", exit -6) while another still talks to it."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return
    if succeeded:
        distributed.barrier()
    distributed.destroy_process_group()
    if succeeded:
        finish_without_teardown()


def finish_without_teardown():
    """End a launched process that finished its work with exit status 0, skipping the interpreter's
    teardown: there a thread of a communication library (gloo's, the store's) can still be joinable
    when its C++ object is destroyed, and the process aborts after a clean finish ("terminate called
    without an active exception", -6; seen under machine load in tests/test_distributed_cli.py even
    after the group was destroyed). Every output is written and closed by then (atomically: see
    ``linearize.outputs``); the streams are flushed here."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be written to it
            pass
    os._exit(0)


from . import convert  # noqa: E402,F401  (registers the commands)
from . import bench, compare, evaluate, export, push, report, run, train  # noqa: E402,F401
