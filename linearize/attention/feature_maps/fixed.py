"""The simple fixed maps of the linear-attention tutorial (seed linear-attention-tutorial).

- ``elu``: φ(x) = elu(x) + 1 (Katharopoulos et al. 2020, "Transformers are RNNs", eq. 7).
- ``relu``: φ(x) = ReLU(x) (tutorial; all-zero features are handled by the core's guard).

No learnable parameters.
"""

from __future__ import annotations

import torch.nn.functional as F

from .base import FeatureMap, register_feature_map


@register_feature_map
class EluFeatureMap(FeatureMap):
    name = "elu"
    paper = "Linear Transformer (Katharopoulos et al. 2020) eq. 7"

    def forward(self, x, mask=None):
        return F.elu(x) + 1.0, None


@register_feature_map
class ReluFeatureMap(FeatureMap):
    name = "relu"
    paper = "ReLU map (linear-attention tutorial)"

    def forward(self, x, mask=None):
        return F.relu(x), None
