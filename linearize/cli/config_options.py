"""Command-line options made from a config dataclass (``linearize.config``): one ``--option``
per field, its default and help taken from the field, so a new stage setting needs no CLI edit."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from typing import Annotated, Optional

import typer


def _option_type(kind):
    """The annotation typer understands: ``X | None`` becomes ``Optional[X]``."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        return Optional[args[0]] if len(args) == 1 else str
    return kind


def _is_int_list(kind):
    """Whether a field's type is ``list[int]`` (or ``list[int] | None``)."""
    kind = _option_type(kind)
    if typing.get_origin(kind) is typing.Union:
        kind = typing.get_args(kind)[0]
    return typing.get_origin(kind) is list and typing.get_args(kind) == (int,)


def _int_list(name, given):
    """A list option's values, each an integer or a comma-separated list (``--x 1 --x 2`` or ``--x 1,2``),
    as one list; anything else is one line naming the option (:func:`~linearize.cli.common.int_list`)."""
    from .common import int_list

    return int_list(",".join(given), "--" + name.replace("_", "-"), "integers", "1,2")


def config_options(config_class, *, include=None, exclude=(), unset_is_none=False,
                   unset_help="unless --recipe sets another", into="config", helps=None):
    """Decorator: the command gains one option per field of ``config_class`` (only ``include``
    when given, never ``exclude``) and receives their values as one argument ``into``: a
    ``config_class`` instance (the fields left out at their defaults) or, with
    ``unset_is_none``, the dict of the options given (every option defaults to None, so a preset
    chosen by the command fills the rest; the help names the field's default and ``unset_help``: when it
    applies). ``helps``: ``{field: help}`` where a command reads a field more narrowly than the field's own help
    says (``eval glue``'s --data-dir is GLUE's layout only)."""
    hints = typing.get_type_hints(config_class)
    chosen = [f for f in dataclasses.fields(config_class)
              if f.name not in exclude and (include is None or f.name in include)]

    lists = [item.name for item in chosen if _is_int_list(hints[item.name])]
    helps = dict(helps or {})
    unknown = set(helps) - {item.name for item in chosen}
    if unknown:
        raise TypeError(f"helps names fields the command does not take: {sorted(unknown)}")

    def parameter(item):
        # a list of integers is read as text, repeated or comma-separated as --layers (_int_list)
        kind = Optional[list[str]] if item.name in lists else _option_type(hints[item.name])
        if unset_is_none:
            kind = Optional[kind]
            default_text = "none" if _default_of(item) is None else _default_of(item)
            help_text = f"{helps.get(item.name, item.metadata.get('help', ''))} (Default {default_text} {unset_help}.)"
            default = None
        else:
            help_text, default = helps.get(item.name, item.metadata.get("help", "")), _default_of(item)
        metavar = {"metavar": "<int,...>"} if item.name in lists else {}
        annotation = Annotated[kind, typer.Option(help=help_text, show_default=not unset_is_none, **metavar)]
        return inspect.Parameter(item.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)

    def decorate(command):
        signature = inspect.signature(command, eval_str=True)
        kept = [p for p in signature.parameters.values() if p.name != into]
        added = [parameter(item) for item in chosen]

        @functools.wraps(command)
        def wrapper(*args, **kwargs):
            values = {item.name: kwargs.pop(item.name) for item in chosen}
            for name in lists:
                if values[name] is not None:
                    values[name] = _int_list(name, values[name])
            if unset_is_none:
                kwargs[into] = {name: value for name, value in values.items() if value is not None}
            else:
                kwargs[into] = config_class(**values)
            return command(*args, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=kept + added)
        wrapper.__annotations__ = {p.name: p.annotation for p in kept + added}
        return wrapper

    return decorate


def _default_of(item):
    return item.default_factory() if item.default is dataclasses.MISSING else item.default
