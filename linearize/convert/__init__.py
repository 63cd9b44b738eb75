"""Conversion of real architectures (Hugging Face encoders, timm ViTs)."""

from .api import (SUPPORTED, attention_modules, convert, convert_checkpoint, summary, feature_maps_of, is_converted, linearize_config, load,
                  parameter_overhead, read_linearize_block, revert, save)
from .loading import ALIASES, load_source_model, resolve_model_name

__all__ = ["ALIASES", "SUPPORTED", "attention_modules", "convert", "convert_checkpoint", "summary", "feature_maps_of", "is_converted",
           "linearize_config", "load", "load_source_model", "parameter_overhead", "read_linearize_block",
           "resolve_model_name", "revert", "save"]
