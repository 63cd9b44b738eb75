"""cosFormer (Qin et al. 2022, eq. 9-11): ReLU features with a cos/sin re-weighting by position.

    φ(x_i) = ReLU(x_i) · [cos(πi/2N), sin(πi/2N)] ∈ R^{2d}

so that φ(q_i)ᵀφ(k_j) = ReLU(q_i)ᵀReLU(k_j)·cos(π(i−j)/2N). ``i`` is the token's position
among the sequence's real tokens and ``N`` that sequence's real (unpadded) length, so appending
padding changes nothing. No learnable parameters.
"""

from __future__ import annotations

import math

import torch

from .base import FeatureMap, register_feature_map


@register_feature_map
class CosformerFeatureMap(FeatureMap):
    name = "cosformer"
    chunkable = True
    nonnegative = True
    paper = "cosFormer (Qin et al. 2022) eq. 9-11"
    in_default_comparison = True
    order = 9
    card_note = ("**cosFormer** (Qin et al., 2022) adds no parameters: it re-weights ReLU features by the cosine "
                 "and sine of the token's position in its sequence, so that nearby tokens attend to each other "
                 "more.")

    def __init__(self, head_dim, num_heads=1):
        super().__init__(head_dim, num_heads)
        self.feature_dim = 2 * self.head_dim

    def forward(self, x, mask=None):
        batch, _, seq, _ = x.shape
        if mask is None:
            mask = torch.ones(batch, seq, device=x.device, dtype=x.dtype)
        return self.chunk_features(x, mask, 0)

    def chunk_features(self, x, mask, start):
        """Positions and lengths come from the full mask, so a chunk gets its own angles."""
        position = (mask.cumsum(dim=1) - 1.0).clamp_min(0.0)  # index among real tokens
        length = mask.sum(dim=1, keepdim=True).clamp_min(1.0)
        angle = ((math.pi / 2.0) * position / length)[:, start:start + x.shape[2]]  # [B,c]
        trig = torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1)  # [B,c,2]
        # [ReLU(x)·cos, ReLU(x)·sin] as one broadcast product: [B,H,c,2,d] -> [B,H,c,2d]
        return (torch.relu(x)[..., None, :] * trig[:, None, :, :, None]).flatten(-2), None
