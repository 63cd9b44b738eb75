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

from .base import FeatureMap, MethodOptions, at_least, per_head_matmul, register_feature_map


#: ATen's softmax into a given tensor, used in place: one pass over the features that keeps each row in cache,
#: where the in-place ``amax``, ``sub_``, ``exp_``, ``sum``, ``mul_`` make five over memory (a feature call at
#: MiniLM's geometry, 900 tokens, 2-core CPU: ~10% faster alone, more inside the model, where the features do not
#: stay in cache between passes). None on a PyTorch without it: then those five.
SOFTMAX_INTO = getattr(getattr(torch.ops.aten, "_softmax", None), "out", None)


@dataclass
class HedgehogOptions(MethodOptions):
    feature_dim: int | None = field(default=None, metadata={
        "help": "d': rows of W (features = 2d'); default the head dim.", "range": at_least(1)})


@register_feature_map
class HedgehogFeatureMap(FeatureMap):
    name = "hedgehog"
    nonnegative = True
    chunkable = True
    writes_out = True
    folds_input_scale = True
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
        self.feature_dim = 2 * width
        self.weight = nn.Parameter(torch.eye(width, self.head_dim).repeat(self.num_heads, 1, 1))  # [H,d',d]

    def forward(self, x, mask=None, out=None, input_scale=None):
        # one product with [W; -W] gives [Wx, -Wx]; one softmax over the two halves; with input_scale, the features
        # of input_scale · x: the factor in the stacked weight
        both = self.reused("both", x.dtype, lambda: self._both(x), self.weight, input_scale=input_scale)  # [H,d,2d']
        if out is None:
            z = torch.matmul(x, both)  # [B,H,N,2d']
            return torch.softmax(z.unflatten(-1, (2, -1)), dim=-1).flatten(-2), None
        # inference into the caller's buffer: the softmax in place (no autograd here)
        z = per_head_matmul(x, both, out).unflatten(-1, (2, -1))
        stored = z if z.is_contiguous() else z.transpose(0, 1)  # the chunked path's buffers are head-major
        if SOFTMAX_INTO is not None and stored.is_contiguous():
            SOFTMAX_INTO(stored, -1, False, out=stored)
            return out, None
        z.sub_(z.amax(dim=-1, keepdim=True)).exp_()
        return z.mul_(z.sum(dim=-1, keepdim=True).reciprocal_()).flatten(-2), None  # each sum is at least 1

    def _both(self, x):
        weight = self.cast(self.weight, x)  # [H,d',d]
        return torch.cat([weight, -weight], dim=1).transpose(1, 2)
