"""The simple fixed maps (Brenndoerfer 2025, "Linear Attention: Breaking the Quadratic Bottleneck with
Kernel Feature Maps", the ELU and ReLU maps).

- ``elu``: φ(x) = elu(x) + 1 (Katharopoulos et al. 2020, "Transformers are RNNs", eq. 7),
  evaluated as exp(min(x, 0)) + ReLU(x).
- ``relu``: φ(x) = ReLU(x) (tutorial; all-zero features are handled by the core's guard).

No learnable parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import FeatureMap, register_feature_map


#: elu's and relu's card paragraph (one paragraph for both)
FIXED_MAPS_NOTE = ("**Fixed feature maps** add no parameters: `elu` uses φ(x) = elu(x) + 1 (Katharopoulos "
                   "et al., 2020, *Transformers are RNNs*) and `relu` uses φ(x) = ReLU(x).")


@register_feature_map
class EluFeatureMap(FeatureMap):
    name = "elu"
    nonnegative = True
    chunkable = True
    paper = "Linear Transformer (Katharopoulos et al. 2020) eq. 7"
    card_note = FIXED_MAPS_NOTE
    in_default_comparison = True
    order = 7

    def forward(self, x, mask=None):
        # elu(x) + 1 = exp(min(x, 0)) + relu(x), value and gradient (1 at x = 0) alike; ATen's
        # elu goes through a scalar expm1 that is ~6x slower than this vectorised form
        return torch.exp(x.clamp(max=0.0)) + F.relu(x), None


@register_feature_map
class ReluFeatureMap(FeatureMap):
    name = "relu"
    nonnegative = True
    chunkable = True
    paper = "ReLU map (linear-attention tutorial)"
    card_note = FIXED_MAPS_NOTE
    order = 8

    def forward(self, x, mask=None):
        return F.relu(x), None
