"""Flexformer: learnable random-Fourier-feature kernels (Zhang and Zhou, "Flexformer: Flexible Linear
Transformer with Learnable Attention Kernel", §3.2).

Both variants split the softmax kernel as in Flexformer eq. 4,
``exp(xᵀy) = exp(‖x‖²/2) · exp(−‖x−y‖²/2) · exp(‖y‖²/2)`` (inputs here are already q/d^¼, so the
paper's bandwidth √d becomes 1 and its ω ~ N(0, I/√d) becomes ω ~ N(0, I)).

- ``flexformer-s`` (stationary, §3.2 with Bochner's theorem, eq. 5):
  ``φ(x) = exp(‖x‖²/2) · (1/√n) [cos ωᵢᵀx, sin ωᵢᵀx]``, ω learnable, init N(0, I).
- ``flexformer-n`` (nonstationary, §3.2 eq. 6 with Yaglom's theorem): pairs (ω1ᵢ, ω2ᵢ),
  ω' = (ω1+ω2)/2, ω'' = (ω1−ω2)/2,
  ``φ(x) = exp(‖x‖²/e^τ) · (1/(2√n)) [cos ω'ᵢᵀx · cos ω''ᵢᵀx, sin ω'ᵢᵀx · cos ω''ᵢᵀx]``
  with ω1, ω2 (init i.i.d. N(0, I)) and τ learnable; τ init log 2 reproduces the softmax
  envelope (the paper's e^τ = 2√d in unscaled coordinates). ω1 and ω2 start apart: at
  ω1 = ω2 the gradient with respect to ω'' vanishes and the map could never leave the
  stationary family.

Parameters are independent across heads (Flexformer Appendix B). ``num_frequencies`` = n
defaults to the head dim (D = 2n). Numerics: the envelope is returned as ``log_scale``, so it
is never exponentiated unshifted (see ``core``). The trigonometric features can make a kernel
value negative; the core's guarded normaliser keeps the weights finite and
``core.kernel_statistics`` reports the fraction of negative values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from ...errors import LinearizeError
from .base import FeatureMap, MethodOptions, register_feature_map


def _frequencies(num_heads, num_frequencies, head_dim):
    return nn.Parameter(torch.randn(num_heads, num_frequencies, head_dim))


@dataclass
class FlexformerOptions(MethodOptions):
    num_frequencies: int | None = field(default=None, metadata={
        "help": "n: learned frequencies per head (features = 2n); default the head dim."})


class _Flexformer(FeatureMap):
    options_class = FlexformerOptions
    in_default_comparison = True
    card_note = ("**Flexformer** learns random-Fourier-feature kernels. The stationary variant "
                 "(`flexformer-s`, Bochner's theorem) learns the frequencies ω of "
                 "φ(x) = exp(‖x‖²/2)·[cos ωᵢᵀx, sin ωᵢᵀx]/√n; the non-stationary variant "
                 "(`flexformer-n`, Yaglom's theorem) learns pairs of frequencies and the bandwidth of "
                 "the envelope, and can represent kernels that depend on more than q − k.")

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__(head_dim, num_heads, **options)
        num_frequencies = self.settings.num_frequencies
        self.num_frequencies = self.head_dim if num_frequencies is None else num_frequencies
        if self.num_frequencies < 1:
            raise LinearizeError(f"{self.name}: num_frequencies must be >= 1, got {num_frequencies}")
        self.feature_dim = 2 * self.num_frequencies


@register_feature_map
class FlexformerStationaryFeatureMap(_Flexformer):
    name = "flexformer-s"
    chunkable = True
    paper = "Flexformer-s §3.2 eq. 4-5"
    order = 5

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__(head_dim, num_heads, **options)
        self.omega = _frequencies(self.num_heads, self.num_frequencies, self.head_dim)

    def forward(self, x, mask=None):
        proj = torch.matmul(x, self.cast(self.omega, x).transpose(1, 2))  # [B,H,N,n]
        features = torch.cat([torch.cos(proj), torch.sin(proj)], dim=-1).mul_(1.0 / math.sqrt(self.num_frequencies))
        return features, 0.5 * x.pow(2).sum(dim=-1, keepdim=True)


@register_feature_map
class FlexformerNonstationaryFeatureMap(_Flexformer):
    name = "flexformer-n"
    chunkable = True
    paper = "Flexformer-n §3.2 eq. 6"
    order = 6

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__(head_dim, num_heads, **options)
        self.omega1 = _frequencies(self.num_heads, self.num_frequencies, self.head_dim)
        self.omega2 = _frequencies(self.num_heads, self.num_frequencies, self.head_dim)
        self.tau = nn.Parameter(torch.full((self.num_heads,), math.log(2.0)))

    def forward(self, x, mask=None):
        omega1, omega2 = self.cast(self.omega1, x), self.cast(self.omega2, x)
        # one product for ω'ᵀx and ω''ᵀx: [B,H,N,2n]
        proj = torch.matmul(x, torch.cat([(omega1 + omega2) / 2, (omega1 - omega2) / 2], dim=1).transpose(1, 2))
        mean, half_diff = proj.chunk(2, dim=-1)
        gate = torch.cos(half_diff).mul_(1.0 / (2.0 * math.sqrt(self.num_frequencies)))
        features = torch.cat([torch.cos(mean), torch.sin(mean)], dim=-1)  # [B,H,N,2n]
        features = (features.unflatten(-1, (2, -1)) * gate[..., None, :]).flatten(-2)
        log_scale = x.pow(2).sum(dim=-1, keepdim=True) / torch.exp(self.cast(self.tau, x))[:, None, None]
        return features, log_scale
