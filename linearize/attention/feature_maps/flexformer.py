"""Flexformer: learnable random-Fourier-feature kernels (Zhang and Zhou, "Flexformer: Flexible Linear
Transformer with Learnable Attention Kernel", §3.2).

Both variants split the softmax kernel as in Flexformer eq. 4,
``exp(xᵀy) = exp(‖x‖²/2) · exp(−‖x−y‖²/2) · exp(‖y‖²/2)`` (inputs here are already q/d^¼, so the
paper's bandwidth √d becomes 1 and its ω ~ N(0, I/√d) becomes ω ~ N(0, I)).

- ``flexformer-s`` (stationary, §3.2 with Bochner's theorem, eq. 5):
  ``φ(x) = exp(‖x‖²/2) · (1/√n) [cos ωᵢᵀx, sin ωᵢᵀx]``, ω learnable, init N(0, I).
  Not in the paper, off by default: ``learnable_envelope=True`` makes the envelope
  ``exp(‖x‖²/e^τ)`` with τ learned per head (as flexformer-n's), and with ``init_scale`` s
  (ω ~ N(0, s²I), τ₀ = log(2/s²)) the expected kernel starts at exp(s²·qᵀk) (Bochner:
  E[cos ωᵀ(q−k)] = exp(−s²‖q−k‖²/2)). The paper's fixed envelope exp(‖x‖²/2) leaves a small-ω
  start with attention set by the key norms alone (docs/methods.md).
- ``flexformer-n`` (nonstationary, §3.2 eq. 6 with Yaglom's theorem): pairs (ω1ᵢ, ω2ᵢ),
  ω' = (ω1+ω2)/2, ω'' = (ω1−ω2)/2,
  ``φ(x) = exp(‖x‖²/e^τ) · (1/(2√n)) [cos ω'ᵢᵀx · cos ω''ᵢᵀx, sin ω'ᵢᵀx · cos ω''ᵢᵀx]``
  with ω1, ω2 and τ learnable. ω1 and ω2 start apart: at ω1 = ω2 the gradient with respect to
  ω'' vanishes and the map could never leave the stationary family.

  Initialisation (the paper gives none): ω1, ω2 ~ N(0, s²I) i.i.d. and τ₀ = log(2/s²), s the
  ``init_scale`` option. Then ω' and ω'' are independent N(0, s²I/2), E[cos ω'ᵀ(q−k)] =
  exp(−s²‖q−k‖²/4) and E[cos ω''ᵀq · cos ω''ᵀk] = (exp(−s²‖q−k‖²/4) + exp(−s²‖q+k‖²/4))/2, so
  with the envelope exp(s²(‖q‖²+‖k‖²)/2) the expected kernel is

      E[φ(q)ᵀφ(k)] = (exp(s²·qᵀk) + 1) / 8,

  the softmax kernel at temperature s² plus a constant. ``init_scale = 1`` is the start the paper
  implies (ω ~ N(0, I/√d) of eq. 5-6 and the softmax envelope e^τ = 2√d, here 2): its kernel is
  (exp(qᵀk) + 1)/8, but the trigonometric estimate's noise (~1/√(2n)) dwarfs the Gaussian factor
  exp(−‖q−k‖²/2) on a pretrained encoder's queries and keys, and 42–45% of the weights start
  negative on all-MiniLM-L6-v2. The default ``init_scale = 0.1`` starts every weight positive
  and close to uniform-plus-softmax, which stage 1 then sharpens
  (docs/experiments/flexformer-probe/RESULTS.md, "init_scale and the negative-weight penalty").

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

from .base import FeatureMap, MethodOptions, above, at_least, register_feature_map


def _frequencies(num_heads, num_frequencies, head_dim, scale=1.0):
    return nn.Parameter(torch.randn(num_heads, num_frequencies, head_dim) * scale)


@dataclass
class FlexformerOptions(MethodOptions):
    num_frequencies: int | None = field(default=None, metadata={
        "help": "n: learned frequencies per head (features = 2n); default the head dim.", "range": at_least(1)})


class _Flexformer(FeatureMap):
    options_class = FlexformerOptions
    in_default_comparison = True
    skips_log_scale = True
    card_note = ("**Flexformer** learns random-Fourier-feature kernels. The stationary variant "
                 "(`flexformer-s`, Bochner's theorem) learns the frequencies ω of "
                 "φ(x) = exp(‖x‖²/2)·[cos ωᵢᵀx, sin ωᵢᵀx]/√n; the non-stationary variant "
                 "(`flexformer-n`, Yaglom's theorem) learns pairs of frequencies and the bandwidth of "
                 "the envelope, and can represent kernels that depend on more than q − k.")

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__(head_dim, num_heads, **options)
        num_frequencies = self.settings.num_frequencies
        self.num_frequencies = self.head_dim if num_frequencies is None else num_frequencies
        self.feature_dim = 2 * self.num_frequencies


@dataclass
class FlexformerStationaryOptions(FlexformerOptions):
    learnable_envelope: bool = field(default=False, metadata={
        "help": "Not in the paper: learn the envelope's bandwidth, exp(‖x‖²/e^τ) per head, τ starting at log(2/s²)."})
    init_scale: float = field(default=1.0, metadata={
        "help": "s: ω starts as N(0, s²I) (1 = the paper's); with learnable_envelope the kernel starts as exp(s²qᵀk).",
        "range": above(0)})


@register_feature_map
class FlexformerStationaryFeatureMap(_Flexformer):
    name = "flexformer-s"
    initial_gamma = 3.0  # hybrid attention's γ start: R = 32 + first before training, KL 5.30 against 5.89 at 0.1
    chunkable = True
    paper = "Flexformer-s §3.2 eq. 4-5"
    order = 5
    options_class = FlexformerStationaryOptions

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__(head_dim, num_heads, **options)
        scale = self.settings.init_scale  # > 0 (the options' range)
        self.omega = _frequencies(self.num_heads, self.num_frequencies, self.head_dim, scale)
        if self.settings.learnable_envelope:
            self.tau = nn.Parameter(torch.full((self.num_heads,), math.log(2.0 / scale**2)))

    def forward(self, x, mask=None, log_scale=True):
        proj = torch.matmul(x, self.cast(self.omega, x).transpose(1, 2))  # [B,H,N,n]
        features = torch.cat([torch.cos(proj), torch.sin(proj)], dim=-1).mul_(1.0 / math.sqrt(self.num_frequencies))
        if not log_scale:  # a query's: its envelope is dropped
            return features, None
        if self.settings.learnable_envelope:
            return features, x.pow(2).sum(dim=-1, keepdim=True) / torch.exp(self.cast(self.tau, x))[:, None, None]
        return features, 0.5 * x.pow(2).sum(dim=-1, keepdim=True)


@dataclass
class FlexformerNonstationaryOptions(FlexformerOptions):
    init_scale: float = field(default=0.1, metadata={
        "help": "s: ω1, ω2 start as N(0, s²I) and τ as log(2/s²), so the kernel starts as (exp(s²qᵀk)+1)/8, "
                "every weight positive; 1 = the paper's implied start (mostly noise, weights negative).",
        "range": above(0)})


@register_feature_map
class FlexformerNonstationaryFeatureMap(_Flexformer):
    name = "flexformer-n"
    initial_gamma = 0.03  # hybrid attention's γ start: R = 32 + first before training, KL 0.823 against 0.887 at 0.1
    chunkable = True
    paper = "Flexformer-n §3.2 eq. 6"
    order = 6
    options_class = FlexformerNonstationaryOptions

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__(head_dim, num_heads, **options)
        scale = self.settings.init_scale  # > 0 (the options' range)
        self.omega1 = _frequencies(self.num_heads, self.num_frequencies, self.head_dim, scale)
        self.omega2 = _frequencies(self.num_heads, self.num_frequencies, self.head_dim, scale)
        self.tau = nn.Parameter(torch.full((self.num_heads,), math.log(2.0 / scale**2)))

    def forward(self, x, mask=None, log_scale=True):
        omega1, omega2 = self.cast(self.omega1, x), self.cast(self.omega2, x)
        # one product for ω'ᵀx and ω''ᵀx: [B,H,N,2n]
        proj = torch.matmul(x, torch.cat([(omega1 + omega2) / 2, (omega1 - omega2) / 2], dim=1).transpose(1, 2))
        mean, half_diff = proj.chunk(2, dim=-1)
        gate = torch.cos(half_diff).mul_(1.0 / (2.0 * math.sqrt(self.num_frequencies)))
        features = torch.cat([torch.cos(mean), torch.sin(mean)], dim=-1)  # [B,H,N,2n]
        features = (features.unflatten(-1, (2, -1)) * gate[..., None, :]).flatten(-2)
        if not log_scale:  # a query's: its envelope is dropped
            return features, None
        return features, x.pow(2).sum(dim=-1, keepdim=True) / torch.exp(self.cast(self.tau, x))[:, None, None]
