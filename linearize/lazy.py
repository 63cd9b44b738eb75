"""Packages that import their public names on first use (PEP 562), as transformers' own lazy
modules do: importing such a package, or a light module inside it, loads neither torch nor
transformers, so the command line parses its arguments and checks its paths before any heavy
import."""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package, exports):
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` (its ``__name__``), whose
    public names are ``exports``: ``{name: its module, relative to the package (".api") or absolute}``.
    A name is imported from its module on first use and kept in the package from then on."""

    def __getattr__(name):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        vars(sys.modules[package])[name] = value  # the package's own namespace: no __getattr__ next time
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
