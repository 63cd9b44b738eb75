"""Linear-attention core and feature maps (only depends on torch)."""

from .core import (kernel_matrix, kernel_statistics, linear_attention, linear_attention_weights,
                   quadratic_attention, softmax_attention_weights)
from .feature_maps import (FEATURE_MAPS, FeatureMap, create_feature_map, method_options, methods,
                           register_feature_map)

__all__ = ["FEATURE_MAPS", "FeatureMap", "create_feature_map", "kernel_matrix", "kernel_statistics",
           "linear_attention", "linear_attention_weights", "method_options", "methods", "quadratic_attention",
           "register_feature_map", "softmax_attention_weights"]
