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


@app.callback()
def root():
    """linearize: convert, distill, fine-tune, evaluate and publish linear-attention encoders."""
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


def is_user_path_error(error, arguments):
    """A path error about a path the user named (or one inside it); elsewhere it is a bug."""
    if not isinstance(error, PATH_ERRORS):
        return False
    names = [name for name in (error.filename, error.filename2) if name is not None]
    given = [str(value) for value in arguments if isinstance(value, (str, os.PathLike)) and str(value)]
    return not names or any(_under(os.fsdecode(name), root) for name in names for root in given)


def friendly_errors(command):
    """Map the user's errors to one line on stderr and a non-zero exit; anything else keeps its traceback.

    User errors: :class:`LinearizeError` (exit 1), a path error on a path the user gave (exit 1) and a
    bad option value (``typer.BadParameter``, exit 2 as when Typer itself rejects one). Every other
    exception, a ``ValueError`` from a bug included, propagates with its traceback. With
    ``LINEARIZE_DEBUG=1`` the user errors are raised with their traceback too.
    """

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (LinearizeError, typer.BadParameter, *PATH_ERRORS) as error:
            user_error = not isinstance(error, PATH_ERRORS) or is_user_path_error(error, [*args, *kwargs.values()])
            if not user_error or debug_enabled():
                raise
            message = error.format_message() if isinstance(error, typer.BadParameter) else str(error)
            err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
            raise typer.Exit(2 if isinstance(error, typer.BadParameter) else 1) from None

    return wrapper


def parse_layers(text):
    """``"0,2,4"`` -> ``[0, 2, 4]``; None stays None (all layers)."""
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise LinearizeError(f"--layers {text!r} is not a comma-separated list of layer indices (example: 0,2,4)") from None


#: the data options of `linearize distill` / `finetune` / `eval text`, made from DataConfig's fields
TEXT_DATA_FIELDS = ("data_dir", "data_file", "train_file", "validation_file", "test_file", "text_column",
                    "text_pair_column", "label_column", "dev_fraction", "max_length", "max_train_examples",
                    "max_eval_examples")


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
