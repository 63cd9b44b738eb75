"""Conversion backends: one per model family, behind one interface.

A backend knows how to find a family's self-attention modules and how to attach, detach, save and
load feature maps on them; ``linearize.convert`` / ``revert`` / ``load`` pick the backend and do the
rest (option checks, layer choice, the conversion record) once for all families.

    class Backend:
        name                                    # "hf" or "timm"
        matches(model) -> bool
        attention_modules(model) -> [(qualified name, module)]
        sliding_window_layers(model) -> [index]  # attention layers with a sliding window (never made global)
        record(model, source) -> dict           # family-specific fields of the ConversionRecord
        attach(model, method, layers, options, hybrid)  # feature maps on the chosen layers (hybrid: window, sinks, γ)
        store_record(model, record)             # keep the ConversionRecord where save and load find it
        detach(model)
        save(model, directory)                  # weights + config.json with the linearize block
        load(directory, data, record, **kwargs) -> model

Adding a family = one module here with such a class, and one entry in ``BACKENDS``.
"""

from __future__ import annotations

from .hf import HFBackend
from .timm import TimmBackend

BACKENDS = (HFBackend(), TimmBackend())


def backend_for(model):
    """The backend that handles ``model``, or None."""
    return next((backend for backend in BACKENDS if backend.matches(model)), None)


def backend_for_record(record):
    """The backend that saved a folder, from its :class:`~linearize.convert.record.ConversionRecord`."""
    name = "timm" if record.is_timm else "hf"
    return next(backend for backend in BACKENDS if backend.name == name)


__all__ = ["BACKENDS", "HFBackend", "TimmBackend", "backend_for", "backend_for_record"]
