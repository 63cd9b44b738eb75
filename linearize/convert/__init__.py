"""Conversion of real architectures (Hugging Face encoders, timm ViTs)."""

from .api import (SUPPORTED, attention_modules, conversion_record, convert, convert_checkpoint, summary, feature_maps_of,
                  is_converted, load, parameter_overhead, read_conversion_record, revert, save)
from .loading import ALIASES, load_source_model, resolve_model_name
from .record import ConversionRecord

__all__ = ["ALIASES", "SUPPORTED", "ConversionRecord", "attention_modules", "conversion_record", "convert",
           "convert_checkpoint", "summary", "feature_maps_of", "is_converted", "load", "load_source_model",
           "parameter_overhead", "read_conversion_record", "resolve_model_name", "revert", "save"]
