"""Exact softmax attention through the same patch as every linear method.

Converting with ``softmax`` must leave a model's outputs unchanged; it is the control of every
conversion test and the teacher path of stage-1 distillation. Computed with PyTorch's
``scaled_dot_product_attention`` (Vaswani et al. 2017, eq. 1).
"""

from __future__ import annotations

from ..core import softmax_attention, softmax_attention_weights
from .base import FeatureMap, register_feature_map


@register_feature_map
class SoftmaxAttention(FeatureMap):
    name = "softmax"
    paper = "exact softmax (Vaswani et al. 2017)"
    exact_softmax = True
    order = 1000  # listed last
    card_note = ("**softmax** is exact softmax attention computed through linearize's attention patch: the "
                 "control of every conversion. Its outputs equal the source model's, and it brings no "
                 "linear-attention speed-up.")

    def forward(self, x, mask=None):
        raise TypeError("softmax attention has no finite feature map; call attend()")

    def attend(self, q, k, v, key_padding_mask=None, scale=None, output_attentions=False, dropout=0.0):
        out = softmax_attention(q, k, v, key_padding_mask, scale, dropout)
        weights = softmax_attention_weights(q, k, key_padding_mask, scale) if output_attentions else None
        return out, weights
