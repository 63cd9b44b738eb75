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
        run_app()
        succeeded = True
    except SystemExit as done:
        succeeded = done.code in (None, 0)
        raise
    finally:
        leave_process_group(succeeded)


def run_app():
    """Run ``app`` and exit with its status. Click's own usage errors (an unknown option or command, a
    missing argument, a value of the wrong type) are one line, as every other user error is:
    ``error: <what> (see linearize CMD --help)``, exit 2 (Typer's box put the usage line and a hint around
    the message: five lines)."""
    import typer
    from rich.markup import escape
    from typer._click import exceptions as parse_errors  # Typer 0.29 (pinned) carries its own copy of click

    try:
        code = app(standalone_mode=False)
    except parse_errors.NoArgsIsHelpError as error:  # a command group without a command: its help, printed
        raise SystemExit(error.exit_code) from None
    except parse_errors.ClickException as error:
        context = getattr(error, "ctx", None)
        usage = isinstance(error, parse_errors.UsageError) and context is not None
        hint = f" (see {context.command_path} --help)" if usage else ""
        err_console.print(f"[bold red]error:[/] {escape(error.format_message() + hint)}", highlight=False,
                          soft_wrap=True)
        raise SystemExit(error.exit_code) from None
    except typer.Abort:  # end of input at a prompt
        err_console.print("aborted", highlight=False)
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)


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
