"""The feature-map library: importing this package registers every method."""

from .base import (FEATURE_MAPS, FeatureMap, check_method_options, create_feature_map, get_feature_map_class,
                   method_options, methods, register_feature_map)
from . import luna, hedgehog, t2r, performer, darkformer, flexformer, fixed, cosformer, softmax  # noqa: F401

#: the modules, in order, that a saved model's self-contained remote code bundles
MAP_MODULES = ["base", "luna", "hedgehog", "t2r", "performer", "darkformer", "flexformer", "fixed", "cosformer",
               "softmax"]

__all__ = ["FEATURE_MAPS", "FeatureMap", "MAP_MODULES", "check_method_options", "create_feature_map",
           "get_feature_map_class", "method_options", "methods", "register_feature_map"]
