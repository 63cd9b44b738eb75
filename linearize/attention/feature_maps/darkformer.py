"""DARKFormer: positive random features with a learned covariance (Farzam et al., "Data-Aware Random
Feature Kernel for Transformers", §4.1 eq. 3 and Appendix B).

    x̃ = Mx,   φ(x) = exp(zᵢᵀx̃ − ‖x̃‖²/2) / √m,   E[φ(q)ᵀφ(k)] = exp(qᵀΣk),  Σ = MᵀM

``M ∈ R^{r×d}`` per head is learned (init identity, so training starts from the Performer
estimate of the softmax kernel); ``z`` are fixed i.i.d. Gaussian rows drawn from ``seed`` and
saved as a buffer. ``init="whiten"`` marks the paper's whitening initialisation
``M = Λ^{-½}`` (§4.1: Σ = Λ^{-1} makes Mq, Mk isotropic), where Λ is the covariance of the
layer's (scaled) queries and keys; call :meth:`calibrate` with a sample of them, from Python
(conversion takes no calibration data, so ``linearize.convert`` refuses ``init="whiten"``: M would
stay the identity). Stabilised in log space like ``performer``.
"""

from __future__ import annotations

import torch
from dataclasses import dataclass, field

from torch import nn

from ...errors import LinearizeError
from ..core import scratch
from .base import FeatureMap, MethodOptions, at_least, one_of, per_head_matmul, register_feature_map, seeded_generator
from .performer import LOG2_E, exponentiated_projection, features_from_projection


@dataclass
class DarkformerOptions(MethodOptions):
    num_features: int = field(default=64, metadata={"help": "m: random features per head.", "range": at_least(1)})
    seed: int = field(default=0, metadata={"help": "Seed of the random rows z (offset by the layer index).",
                                           "range": at_least(0)})
    rank: int | None = field(default=None, metadata={"help": "r: rows of M; default the head dim.",
                                                     "range": at_least(1)})
    init: str = field(default="identity", metadata={
        "help": "identity, or whiten (M = the q/k covariance's inverse square root: calibrate() from Python).",
        "range": one_of("identity", "whiten")})


@register_feature_map
class DarkformerFeatureMap(FeatureMap):
    name = "darkformer"
    nonnegative = True
    chunkable = True
    writes_out = True
    folds_input_scale = True
    skips_log_scale = True
    # hybrid attention's γ start: with R = 32 + first the KL before training falls over the whole grid 0.01-10
    # (2.254 at 0.1, 0.925 at 10: its keys' features are scaled down by the per-sequence max); 10, the grid's edge
    initial_gamma = 10.0
    paper = "DARKFormer §4.1 eq. 3"
    options_class = DarkformerOptions
    in_default_comparison = True
    order = 4
    card_note = ("**DARKFormer** applies positive random features to Mx with a learned per-head matrix M, "
                 "so that φ(q)ᵀφ(k) estimates exp(qᵀΣk) with a learned covariance Σ = MᵀM "
                 "(M = identity at initialisation, which is the Performer estimate).")

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__(head_dim, num_heads, **options)
        num_features, seed, rank, init = (self.settings.num_features, self.settings.seed, self.settings.rank,
                                          self.settings.init)
        self.num_features = num_features
        self.rank = self.head_dim if rank is None else rank
        if self.rank > self.head_dim:  # the other ranges are DarkformerOptions'
            raise LinearizeError(f"darkformer: option rank must be at most the head dim ({self.head_dim}), got {rank}")
        self.feature_dim = self.num_features
        self.metric = nn.Parameter(torch.eye(self.rank, self.head_dim).repeat(self.num_heads, 1, 1))  # M [H,r,d]
        z = torch.randn(self.num_heads, self.num_features, self.rank, generator=seeded_generator(seed))
        self.register_buffer("z", z)

    @classmethod
    def conversion_problem(cls, settings):
        if settings.init == "whiten":
            return ("init=whiten needs calibration data, which conversion does not take (M would stay the "
                    "identity); use init=identity, or whiten from Python: create_feature_map(..., init='whiten') "
                    "and its calibrate(samples of the scaled queries and keys)")
        return None

    @torch.no_grad()
    def calibrate(self, x, eps=1e-5):
        """Whitening init M = Λ^{-½} per head from samples ``x [..., H, T, d]`` of scaled q/k
        (the top-``rank`` principal directions when rank < d)."""
        x = x.float().reshape(-1, self.num_heads, x.shape[-2], self.head_dim).transpose(0, 1)
        x = x.reshape(self.num_heads, -1, self.head_dim)
        x = x - x.mean(dim=1, keepdim=True)
        cov = x.transpose(1, 2) @ x / max(x.shape[1] - 1, 1)
        evals, evecs = torch.linalg.eigh(cov)  # ascending
        evals, evecs = evals.flip(-1)[:, : self.rank], evecs.flip(-1)[..., : self.rank]
        metric = evecs.transpose(1, 2) * evals.clamp_min(eps).rsqrt()[..., None]  # Λ^{-½} rows
        if self.rank == self.head_dim:
            metric = evecs @ metric  # symmetric square root
        self.metric.copy_(metric.to(self.metric.dtype))

    def forward(self, x, mask=None, out=None, input_scale=None, log_scale=True):
        # One product gives both zᵢᵀ(Mx) (times log₂ e, see features_from_projection) and Mx (for
        # ‖Mx‖²): x times [zM·log₂ e; M]ᵀ, [H, m + r, d]; with input_scale s, the features of s·x (s in the weight).
        # Without log_scale (a query's, dropped by the caller) only the m columns of zM: Mx serves ‖Mx‖² alone.
        width = self.num_features + (self.rank if log_scale else 0)
        weight = self.reused(f"weight{width}", x.dtype, lambda: self._weight(x)[..., :width].contiguous(),
                             self.metric, self.z, input_scale=input_scale)  # [H,d,width]
        if out is None:
            both = torch.matmul(x, weight)  # [B,H,N,width]
        else:  # inference: the product in a reused buffer, ‖Mx‖² without a squared copy
            batch, heads, seq, _ = x.shape
            both = scratch("darkformer.both", (heads, batch, seq, width), x.device).transpose(0, 1)
            both = per_head_matmul(x, weight, both)
        if not log_scale:
            return exponentiated_projection(both, out), None
        if out is None:
            squared = both[..., self.num_features:].pow(2).sum(dim=-1, keepdim=True)
        else:
            squared = torch.linalg.vector_norm(both[..., self.num_features:], dim=-1, keepdim=True).square_()
        return features_from_projection(both[..., :self.num_features], squared, self.num_features, out)

    def _weight(self, x):
        metric = self.cast(self.metric, x)
        return torch.cat([torch.matmul(self.cast(self.z, x) * LOG2_E, metric), metric], dim=1).transpose(1, 2)
