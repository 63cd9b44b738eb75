"""Hedgehog (Zhang et al. 2024, "The Hedgehog & the Porcupine: Expressive Linear Attentions with
Softmax Mimicry", eq. 3).

    φ(x) = [softmax(Wx), softmax(−Wx)] ∈ R^{2d'}   (softmax over the feature axis)

``W ∈ R^{d'×d}`` per head, identity init (``feature_dim`` = d' defaults to the head dim).
Softmax over features is bounded in (0, 1), so no stabilisation is needed.
"""

from __future__ import annotations

import torch
from dataclasses import dataclass, field

from torch import nn

from ...errors import LinearizeError
from .base import FeatureMap, MethodOptions, register_feature_map


@dataclass
class HedgehogOptions(MethodOptions):
    feature_dim: int | None = field(default=None, metadata={
        "help": "d': rows of W (features = 2d'); default the head dim."})


@register_feature_map
class HedgehogFeatureMap(FeatureMap):
    name = "hedgehog"
    nonnegative = True
    chunkable = True
    paper = "Hedgehog (Zhang et al. 2024) eq. 3"
    options_class = HedgehogOptions
    in_default_comparison = True
    order = 1
    card_note = ("**Hedgehog** (Zhang et al., 2024, *The Hedgehog & the Porcupine*) uses "
                 "φ(x) = [softmax(Wx), softmax(−Wx)], a learned per-head projection W (identity at "
                 "initialisation) followed by a softmax over the feature axis, trained to mimic the spiky, "
                 "monotonic softmax attention weights.")

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__(head_dim, num_heads, **options)
        feature_dim = self.settings.feature_dim
        width = self.head_dim if feature_dim is None else feature_dim
        if width < 1:
            raise LinearizeError(f"hedgehog: feature_dim must be >= 1, got {feature_dim}")
        self.feature_dim = 2 * width
        self.weight = nn.Parameter(torch.eye(width, self.head_dim).repeat(self.num_heads, 1, 1))  # [H,d',d]

    def forward(self, x, mask=None):
        weight = self.cast(self.weight, x)  # [H,d',d]
        # one product with [W; -W] gives [Wx, -Wx]; one softmax over the two halves
        z = torch.matmul(x, torch.cat([weight, -weight], dim=1).transpose(1, 2))  # [B,H,N,2d']
        return torch.softmax(z.unflatten(-1, (2, -1)), dim=-1).flatten(-2), None
