"""Values checked against a dataclass's field annotations, without loading torch: the run
configuration (``linearize.config``) and the feature maps' options share this check, and the
command line builds its options from those dataclasses before any command runs."""

from __future__ import annotations

import dataclasses
import types
import typing

from .errors import OptionError


def type_name(kind):
    """The annotation ``kind`` as a word: ``int``, ``none``, ..."""
    return "none" if kind is type(None) else getattr(kind, "__name__", str(kind))


def value_fits(value, kind):
    """``value`` is of the annotated type ``kind``: bool is not an int, an int is a float, and
    ``list[X]`` / ``X | None`` / ``Any`` are looked into; nothing is converted."""
    origin = typing.get_origin(kind)
    if kind is typing.Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(value_fits(value, arg) for arg in typing.get_args(kind))
    if origin in (list, tuple):
        item = (typing.get_args(kind) or (typing.Any,))[0]
        return isinstance(value, (list, tuple)) and all(value_fits(v, item) for v in value)
    if origin is dict or kind is dict:
        return isinstance(value, dict)
    if kind is type(None):
        return value is None
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def describe_type(kind):
    """The annotation ``kind`` as the message says it: ``an integer``, ``a list of a number``, ..."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return " or ".join(describe_type(arg) for arg in typing.get_args(kind))
    if typing.get_origin(kind) in (list, tuple):
        return f"a list of {describe_type((typing.get_args(kind) or (typing.Any,))[0])}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            type(None): "null"}.get(kind, type_name(kind))


def check_field_types(config, where=""):
    """``OptionError`` (one line) if a field of the dataclass instance ``config`` holds a value of
    another type than its annotation; ``where`` prefixes the field's name in the message."""
    hints = typing.get_type_hints(type(config))
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if not value_fits(value, hints[item.name]):
            raise OptionError(f"{where}{item.name} must be {describe_type(hints[item.name])}, got {value!r}")
