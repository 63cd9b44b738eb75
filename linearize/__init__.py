"""linearize: convert pretrained softmax-attention encoders to linear attention.

    import linearize
    linearize.methods()                      # the registered feature maps
    fm = linearize.create_feature_map("luna", head_dim=64, num_heads=12)
"""

from .attention import (FeatureMap, create_feature_map, linear_attention, linear_attention_weights,
                        method_options, methods, quadratic_attention, register_feature_map)

__version__ = "0.1.0"

__all__ = ["FeatureMap", "__version__", "create_feature_map", "linear_attention", "linear_attention_weights",
           "method_options", "methods", "quadratic_attention", "register_feature_map"]
