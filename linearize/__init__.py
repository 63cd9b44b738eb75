"""linearize: convert pretrained softmax-attention encoders to linear attention.

    import linearize
    linearize.methods()                      # the registered feature maps
    fm = linearize.create_feature_map("luna", head_dim=64, num_heads=12)
    linearize.convert(model, "luna")         # in place; linearize.revert(model) undoes it
    model.save_pretrained("out"); linearize.load("out")   # timm models too (or linearize.save)

``import linearize`` loads neither torch nor transformers: each public name is imported from its
module on first use (PEP 562, as transformers' own lazy modules do), so the command line answers
``--help`` and argument errors at once.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

from .lazy import lazy_exports
from .threads import prefer_passive_wait

prefer_passive_wait()  # before torch loads: see linearize/threads.py

from .version import __version__  # noqa: E402

#: every public name (but ``__version__``) and the module it is imported from on first use
EXPORTS = {
    **dict.fromkeys(("FeatureMap", "create_feature_map", "linear_attention", "linear_attention_weights",
                     "method_options", "methods", "quadratic_attention", "register_feature_map"), ".attention"),
    **dict.fromkeys(("convert", "load", "revert", "save"), ".convert"),
}

__all__ = ["FeatureMap", "__version__", "convert", "create_feature_map", "load", "revert", "linear_attention", "linear_attention_weights",
           "method_options", "methods", "quadratic_attention", "register_feature_map", "save"]

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports them
    from .attention import (FeatureMap, create_feature_map, linear_attention, linear_attention_weights,
                            method_options, methods, quadratic_attention, register_feature_map)
    from .convert import convert, load, revert, save


__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)


class LazyPackage(types.ModuleType):
    """The package's module type, so that ``linearize.convert`` is always the function: Python binds
    a submodule on its package when it is first imported, and the subpackage ``linearize.convert``
    is imported by every conversion, by whichever name comes first."""

    def __setattr__(self, name, value):
        if name in EXPORTS and isinstance(value, types.ModuleType):
            return  # the subpackage stays reachable as sys.modules["linearize.convert"]
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = LazyPackage
