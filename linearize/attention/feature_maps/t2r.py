"""T2R (Kasai et al. 2021, "Finetuning Pretrained Transformers into RNNs", §3.1).

    φ(x) = ReLU(Wx + b) ∈ R^D

``W ∈ R^{D×d}``, ``b ∈ R^D`` per head, initialised like ``nn.Linear`` (U(±1/√d));
``feature_dim`` = D defaults to the head dim. Without stage-1 distillation this is the papers'
"T2R" row; with it, "T2R-HH" (LUNA Table 2).
"""

from __future__ import annotations

import math

import torch
from dataclasses import dataclass, field

from torch import nn

from .base import FeatureMap, MethodOptions, at_least, per_head_matmul, register_feature_map


@dataclass
class T2ROptions(MethodOptions):
    feature_dim: int | None = field(default=None, metadata={
        "help": "D: rows of W (the features); default the head dim.", "range": at_least(1)})


@register_feature_map
class T2RFeatureMap(FeatureMap):
    name = "t2r"
    nonnegative = True
    chunkable = True
    writes_out = True
    folds_input_scale = True
    initial_gamma = 0.03  # hybrid attention's γ start: R = 32 + first before training, KL 0.923 against 1.166 at 0.1
    paper = "T2R (Kasai et al. 2021) §3.1"
    options_class = T2ROptions
    in_default_comparison = True
    order = 2
    card_note = ("**T2R** (Kasai et al., 2021, *Finetuning Pretrained Transformers into RNNs*) uses a learned "
                 "ReLU feature map, φ(x) = ReLU(Wx + b), with one W and b per head.")

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__(head_dim, num_heads, **options)
        feature_dim = self.settings.feature_dim
        width = self.head_dim if feature_dim is None else feature_dim
        self.feature_dim = width
        bound = 1.0 / math.sqrt(self.head_dim)
        self.weight = nn.Parameter(torch.empty(self.num_heads, width, self.head_dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(self.num_heads, width).uniform_(-bound, bound))

    def forward(self, x, mask=None, out=None, input_scale=None):
        weight, bias = self.cast(self.weight, x).transpose(1, 2), self.cast(self.bias, x)[:, None, :]
        if input_scale is not None:  # the features of input_scale · x: W(s·x) = (s·W)x
            weight = weight * input_scale
        if out is None:
            return torch.relu(torch.matmul(x, weight).add_(bias)), None  # [B,H,N,D]
        return per_head_matmul(x, weight, out).add_(bias).relu_(), None  # inference, into the caller's buffer
