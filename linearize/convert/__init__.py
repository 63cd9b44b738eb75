"""Conversion of real architectures (Hugging Face encoders, timm ViTs).

The names are imported on first use (:mod:`linearize.lazy`): the light modules (``loading``,
``record``, ``heads``) check a model's name and folder without loading torch."""

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

#: every public name and the module it is imported from on first use
EXPORTS = {
    **dict.fromkeys(("SUPPORTED", "attention_modules", "conversion_record", "convert", "convert_checkpoint",
                     "feature_maps_of", "is_converted", "load", "parameter_overhead", "read_conversion_record",
                     "revert", "save", "summary"), ".api"),
    **dict.fromkeys(("ALIASES", "load_source_model", "resolve_model_name"), ".loading"),
    "ConversionRecord": ".record",
}
__all__ = list(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)

if TYPE_CHECKING:  # what type checkers and editors see
    from .api import (SUPPORTED, attention_modules, conversion_record, convert, convert_checkpoint, feature_maps_of,
                      is_converted, load, parameter_overhead, read_conversion_record, revert, save, summary)
    from .loading import ALIASES, load_source_model, resolve_model_name
    from .record import ConversionRecord
