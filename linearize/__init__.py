"""linearize: convert pretrained softmax-attention encoders to linear attention.

    import linearize
    linearize.methods()                      # the registered feature maps
    fm = linearize.create_feature_map("luna", head_dim=64, num_heads=12)
    linearize.convert(model, "luna")         # in place; linearize.revert(model) undoes it
    model.save_pretrained("out"); linearize.load("out")   # timm models too (or linearize.save)
"""

from .threads import prefer_passive_wait

prefer_passive_wait()  # before torch loads: see linearize/threads.py

from .attention import (FeatureMap, create_feature_map, linear_attention, linear_attention_weights,
                        method_options, methods, quadratic_attention, register_feature_map)

from .convert import convert, load, revert, save
from .version import __version__

__all__ = ["FeatureMap", "__version__", "convert", "create_feature_map", "load", "revert", "linear_attention", "linear_attention_weights",
           "method_options", "methods", "quadratic_attention", "register_feature_map", "save"]
