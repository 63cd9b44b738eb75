"""The ``linearize`` command line: it parses arguments and calls the library, nothing more.

Every error a user can cause is printed as one line (``error: ...``) with a non-zero exit;
set ``LINEARIZE_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import functools
import os
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import LinearizeError

app = typer.Typer(
    name="linearize",
    help="Convert pretrained softmax-attention encoders to linear attention (LUNA, Hedgehog, T2R, ...).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(width=max(Console().width, 140))
err_console = Console(stderr=True)

HeadDimOpt = Annotated[int, typer.Option("--head-dim", help="Head dimension used to count parameters.")]
NumHeadsOpt = Annotated[int, typer.Option("--num-heads", help="Heads per layer used to count parameters.")]


@app.callback()
def root():
    """linearize: convert, distill, fine-tune, evaluate and publish linear-attention encoders."""


def friendly_errors(command):
    """Map user errors to one line on stderr and exit code 1 (traceback with LINEARIZE_DEBUG=1)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (LinearizeError, ValueError, FileNotFoundError, FileExistsError, NotADirectoryError) as error:
            if os.environ.get("LINEARIZE_DEBUG"):
                raise
            err_console.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


@app.command("methods")
@friendly_errors
def methods_command(
    head_dim: HeadDimOpt = 64,
    num_heads: NumHeadsOpt = 12,
    option: Annotated[Optional[list[str]], typer.Option(
        "--option", "-o", help="A method option as key=value, e.g. projections=16 (repeatable).")] = None,
):
    """List the attention methods: name, paper, feature size and learned parameters per layer.

    Example: linearize methods --head-dim 32 --num-heads 12
    """
    from .attention import create_feature_map, method_options, methods

    options = parse_options(option)
    every_option = {key for name in methods() for key in method_options(name)}
    unknown = sorted(set(options) - every_option)
    if unknown:
        raise LinearizeError(f"unknown option(s) {', '.join(unknown)}; valid options: {', '.join(sorted(every_option))}")
    table = Table(title=f"linearize methods (head_dim={head_dim}, num_heads={num_heads})")
    for column in ("method", "paper", "feature dim", "learned params / layer", "options (defaults)"):
        table.add_column(column, overflow="fold")
    for name in methods():
        mine = {k: v for k, v in options.items() if k in method_options(name)}
        fm = create_feature_map(name, head_dim, num_heads, **mine)
        feature_dim = "exact" if fm.exact_softmax else str(fm.feature_dim)
        opts = ", ".join(f"{k}={v}" for k, v in method_options(name).items())
        table.add_row(name, fm.paper, feature_dim, f"{fm.num_learnable_parameters():,}", opts or "-")
    console.print(table)


def parse_options(pairs):
    """``["k=v", ...]`` -> ``{k: v}`` with YAML scalars (``8`` -> 8, ``true`` -> True)."""
    import yaml

    options = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise LinearizeError(f"option {pair!r} is not key=value (example: --option projections=16)")
        options[key.strip()] = yaml.safe_load(value) if value.strip() else None
    return options


def main():
    app()


if __name__ == "__main__":
    main()
