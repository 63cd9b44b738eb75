"""What the command modules share: the ``app``, the consoles, the option aliases, the one-line
error handling (:func:`friendly_errors`) and small parsers. ``linearize.cli`` imports the command
modules; they import this, never the package, so the two do not import each other."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import LinearizeError
from ..launcher import launched_processes
from ..outputs import writing_output  # noqa: F401  (the commands' hold on their output folder)
from ..threads import set_threads  # noqa: F401  (the commands' --threads)

app = typer.Typer(
    name="linearize",
    help="Convert pretrained softmax-attention encoders to linear attention (LUNA, Hedgehog, T2R, ...).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(width=max(Console().width, 140))
err_console = Console(stderr=True)

MethodOpt = Annotated[str, typer.Option("--method", "-m", help="Attention method (see `linearize methods`).")]
LayersOpt = Annotated[Optional[str], typer.Option(
    "--layers", help="Comma-separated attention layer indices to convert (default: all; others stay softmax).")]
OptionOpt = Annotated[Optional[list[str]], typer.Option(
    "--option", "-o", help="A method option as key=value, e.g. projections=16 (repeatable).")]
TaskOpt = Annotated[str, typer.Option("--task", help="A GLUE task (sst2, mrpc, ...), moviereviews, moviereviews-long, "
                                                     "embeddings, fashion-mnist, imagefolder, files, or a Hub data set "
                                                     "id.")]
TrainFileOpt = Annotated[Optional[Path], typer.Option(
    "--train-file", help="CSV/TSV/JSON(L) training file (--task embeddings: also .txt, one sentence a line).")]
HeadDimOpt = Annotated[int, typer.Option("--head-dim", help="Head dimension used to count parameters.")]
NumHeadsOpt = Annotated[int, typer.Option("--num-heads", help="Heads per layer used to count parameters.")]
ThreadsOpt = Annotated[Optional[int], typer.Option(
    "--threads", help="CPU threads for torch (default: one per usable core; OpenMP waits passively, so a busy "
                      "machine slows a run but does not stall it: docs/usage.md, 'Threads').")]


def print_version(value: bool):
    if value:
        from ..version import __version__

        typer.echo(f"linearize {__version__}")
        raise typer.Exit()


@app.callback()
def root(version: Annotated[bool, typer.Option(
        "--version", callback=print_version, is_eager=True, help="Print linearize's version and exit.")] = False):
    """linearize: convert, distill, fine-tune, evaluate and publish linear-attention encoders."""
    if launched_processes() == 1:  # read from the environment: a plain command does not load torch here
        return
    from ..training import is_main_process

    if not is_main_process():  # under torchrun / accelerate launch only the main process reports
        import datasets
        import transformers

        console.quiet = True
        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()


#: OSErrors that name a path the user gave (a missing input, an output in the way, no permission)
PATH_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)


def debug_enabled():
    """``LINEARIZE_DEBUG=1`` (any value but empty or 0) shows the traceback of user errors too."""
    return os.environ.get("LINEARIZE_DEBUG", "") not in ("", "0")


def _under(path, root):
    path, root = os.path.abspath(os.path.expanduser(path)), os.path.abspath(os.path.expanduser(root))
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives
        return False


def _temporary_of(path, root):
    """``path`` is a temporary sibling of ``root`` (``.<name>.XXXX``, as the atomic writers make)."""
    path, root = os.path.abspath(os.path.expanduser(path)), os.path.abspath(os.path.expanduser(root))
    return (os.path.dirname(path) == os.path.dirname(root)
            and os.path.basename(path).startswith(f".{os.path.basename(root)}."))


def _given_paths(arguments):
    return [str(value) for value in arguments if isinstance(value, (str, os.PathLike)) and str(value)]


def is_user_path_error(error, arguments):
    """A path error about a path the user named (or one inside it, or the temporary sibling an
    atomic writer makes beside it); elsewhere it is a bug."""
    if not isinstance(error, PATH_ERRORS):
        return False
    names = [os.fsdecode(name) for name in (error.filename, error.filename2) if name is not None]
    given = _given_paths(arguments)
    return not names or any(_under(name, root) or _temporary_of(name, root) for name in names for root in given)


def user_path_message(error, arguments):
    """The message of the path error ``error``, each temporary sibling it names (an internal
    name) replaced by the user's path it stands for."""
    message = str(error)
    for name in (error.filename, error.filename2):
        root = name is not None and next((root for root in _given_paths(arguments)
                                          if _temporary_of(os.fsdecode(name), root)), None)
        if root:
            message = message.replace(repr(os.fsdecode(name)), repr(root))
    return message


#: what an interrupted command says (by its function's name), only what is true of it; others: "interrupted"
INTERRUPTED = {
    "convert_command": "interrupted: a conversion has nothing to resume (its output folder is written whole or not "
                       "at all); run the same command again to start over",
    "export_command": "interrupted: an export has nothing to resume (its file is written whole or not at all); run "
                      "the same command again to start over",
    "distill_command": "interrupted: run the same command again to resume from the last checkpoint in {out}.work "
                       "(--no-resume would start afresh)",
    "finetune_command": "interrupted: run the same command again to resume from the last checkpoint in {out}.work "
                        "(--no-resume would start afresh)",
    "run_command": "interrupted: run the same command again to resume (finished stages and checkpoints are kept)",
    "compare_command": "interrupted: run the same command again to continue (finished runs are kept)",
}


#: the registered methods' names, in ``linearize.methods()``'s order, known here without importing the
#: feature maps (they load torch) so that a mistyped --method answers at once; the registry stays the
#: truth (tests/test_cli_speed_and_setup.py keeps this equal to it)
METHOD_NAMES = ("luna", "hedgehog", "t2r", "performer", "darkformer", "flexformer-s", "flexformer-n", "elu", "relu",
                "cosformer", "softmax")


def check_method_names(*names):
    """A one-line ``LinearizeError`` for the first of ``names`` (None: not given) that names no
    method, with the closest name if one is close, before torch loads (the library checks each
    method against the registry again)."""
    import difflib

    for name in names:
        if name is not None and name not in METHOD_NAMES:
            close = difflib.get_close_matches(name, METHOD_NAMES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise LinearizeError(f"unknown method {name!r}; valid methods: {', '.join(METHOD_NAMES)}{hint}")


def check_arguments(model, *configs):
    """What needs no torch, checked before a command loads it (the library checks it again): the
    model's name (a mistyped folder) and the settings' types and ranges, so these errors answer at once."""
    from ..convert.loading import check_model_name

    check_model_name(model)
    for config in configs:
        config.check()


def friendly_errors(command):
    """Map the user's errors to one line on stderr and a non-zero exit; anything else keeps its traceback.

    User errors: :class:`LinearizeError` (exit 1), a path error on a path the user gave (exit 1), a
    full disk (exit 1) and a bad option value (``typer.BadParameter``, exit 2 as when Typer itself
    rejects one). Ctrl-C is one line saying what a re-run does (:data:`INTERRUPTED`), exit 130.
    Every other exception, a ``ValueError`` from a bug included, propagates with its traceback.
    With ``LINEARIZE_DEBUG=1`` the user errors are raised with their traceback too.
    """

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:
            interrupted(command, kwargs)
        except Exception as error:  # noqa: BLE001  (a Ctrl-C wrapped by a library: see caused_by_interrupt)
            if caused_by_interrupt(error):
                interrupted(command, kwargs)
            if not isinstance(error, (LinearizeError, typer.BadParameter, OSError)):
                raise
            message = user_error_message(error, [*args, *kwargs.values()])
            if message is None or debug_enabled():
                raise
            err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
            raise typer.Exit(2 if isinstance(error, typer.BadParameter) else 1) from None

    return wrapper


def caused_by_interrupt(error):
    """True when a Ctrl-C caused ``error``: transformers' lazy modules turn a KeyboardInterrupt
    raised while they import into a RuntimeError "from" it, so a Ctrl-C while a model loads would
    otherwise end in that traceback."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def interrupted(command, kwargs):
    """Say how to resume after a Ctrl-C and exit 130 (the traceback with ``LINEARIZE_DEBUG=1``)."""
    if debug_enabled():  # where it was when interrupted
        raise
    said = INTERRUPTED.get(command.__name__, "interrupted").format(out=kwargs.get("out") or "<out>")
    err_console.print(escape(said), highlight=False, soft_wrap=True)
    raise typer.Exit(130) from None


def user_error_message(error, arguments):
    """The one line of a user's error (a path error on a path in ``arguments``, a full disk
    anywhere, a :class:`LinearizeError`, a bad option value), or None for a bug."""
    from ..outputs import is_disk_full, write_error

    if isinstance(error, typer.BadParameter):
        return error.format_message()
    if isinstance(error, LinearizeError):
        return str(error)
    if is_disk_full(error):  # never a bug, wherever it happens
        return str(write_error(os.fsdecode(error.filename or "a file"), error.errno, atomic=False))
    if isinstance(error, PATH_ERRORS) and is_user_path_error(error, arguments):
        return user_path_message(error, arguments)
    return None


def int_list(text, option, what, example):
    """``"0,2,4"`` -> ``[0, 2, 4]`` (empty parts skipped); anything but integers is one line naming ``option``."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise LinearizeError(f"{option} {text!r} is not a comma-separated list of {what} (example: {example})") from None


def parse_layers(text):
    """``"0,2,4"`` -> ``[0, 2, 4]``; None stays None (all layers). A list that names no layer
    (``--layers ''``) is an error: it would convert nothing."""
    if text is None:
        return None
    layers = int_list(text, "--layers", "layer indices", "0,2,4")
    if not layers:
        raise LinearizeError(f"--layers {text!r} names no layer: give comma-separated layer indices (example: 0,2,4), "
                             "or leave --layers out to convert every layer")
    return layers


#: the data options of `linearize distill` / `finetune` / `eval text`, made from DataConfig's fields
TEXT_DATA_FIELDS = ("data_dir", "data_file", "train_file", "validation_file", "test_file", "text_column",
                    "text_pair_column", "label_column", "regression", "dev_fraction", "max_length",
                    "max_train_examples", "max_eval_examples")


def print_scores(result, title):
    from rich.table import Table

    table = Table(title=title)
    table.add_column("split")
    metrics = next(iter(result.values()), {})
    for name in metrics:
        table.add_column(name, justify="right")
    for split, values in result.items():
        table.add_row(split, *(f"{values[name]:.4f}" for name in metrics))
    console.print(table)
