"""The feature-map library: importing this package imports every module in it, which registers
every method (a new method is one new file here; see ``base.py``)."""

import importlib
import json
import pkgutil

from ...markdown import markdown_table
from .base import (FEATURE_MAPS, FeatureMap, MethodOptions, OptionError, check_conversion_options, check_field_types,
                   check_method_options, create_feature_map, default_comparison, get_feature_map_class, method_notes,
                   method_options, method_settings, methods, option_help, options_for, register_feature_map)

#: the modules, in order, that a saved model's self-contained remote code bundles: ``base``
#: first, then every other module of this package
MAP_MODULES = ["base"] + sorted(info.name for info in pkgutil.iter_modules(__path__) if info.name != "base")
for _name in MAP_MODULES:
    importlib.import_module(f".{_name}", __name__)
del _name


def methods_table():
    """The README's methods table (Markdown) from the registry: name, paper, options with their
    defaults and help."""
    rows = []
    for name in methods():
        cls = get_feature_map_class(name)
        options = "<br>".join(f"`{option}` ({json.dumps(default)}): {help_text}"
                              for option, default, help_text in option_help(cls.options_class))
        rows.append([f"`{name}`", cls.paper, options or "-"])
    return markdown_table(["method", "paper", "options (default): meaning"], rows, align=["none"] * 3) + "\n"


__all__ = ["FEATURE_MAPS", "FeatureMap", "MAP_MODULES", "MethodOptions", "OptionError", "check_conversion_options",
           "check_field_types", "check_method_options", "create_feature_map", "default_comparison",
           "get_feature_map_class", "method_notes", "method_options", "method_settings", "methods", "methods_table",
           "option_help", "options_for", "register_feature_map"]
