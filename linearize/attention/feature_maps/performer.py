"""Performer FAVOR+ positive random features (Choromanski et al. 2021, "Rethinking Attention with
Performers", Lemma 1; "Data-Aware Random Feature Kernel for Transformers" §2 eq. 1 and Lemma 2.1).

    φ(x) = exp(ωᵢᵀx − ‖x‖²/2) / √m,  i = 1..m,   E[φ(q)ᵀφ(k)] = exp(qᵀk)

with ω the rows of an orthogonal Gaussian matrix (blocks of d orthogonal directions, each row
rescaled to the norm of a Gaussian vector: "orthogonal random features", Choromanski et al.
2021 §2.4). ω is drawn once from ``seed`` per head and kept as a buffer saved with the model;
it is never redrawn, in training or evaluation. ``learnable=True`` makes ω a parameter: the
learned-feature-kernel ("LFK") baseline of DARKFormer §6.

Numerics: the map returns ``features = exp(log φ − s)`` and ``log_scale = s`` with
``s = max_i log φ_i`` per token; the core drops s for queries and subtracts its max over real
keys for keys, so no unbounded exponential is ever taken (docs/methods.md, "numerics").
"""

from __future__ import annotations

import math

import torch
from dataclasses import dataclass, field

from torch import nn

from ..core import LOG2_E
from .base import FeatureMap, MethodOptions, at_least, per_head_matmul, register_feature_map, seeded_generator


def orthogonal_gaussian(rows, dim, generator):
    """``[rows, dim]`` orthogonal random features: Gaussian blocks orthogonalised by QR, each
    row rescaled to the norm of an independent d-dimensional Gaussian vector."""
    if torch.get_default_device().type == "meta":  # sizing only (convert's memory estimate): skip the QR loop
        return torch.empty(rows, dim)
    blocks = []
    for _ in range(math.ceil(rows / dim)):
        q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=generator))
        blocks.append(q.T)
    directions = torch.cat(blocks, dim=0)[:rows]
    norms = torch.randn(rows, dim, generator=generator).norm(dim=1, keepdim=True)
    return directions * norms


def positive_random_features(x, omega, num_features, log_scale=True):
    """FAVOR+ in log space: ``(exp(log φ − s), s)`` for ``x [B,H,N,r]``, ``omega [H,m,r]`` (``s`` None
    without ``log_scale``: :func:`exponentiated_projection`).

    ``log φ_i = ωᵢᵀx − ‖x‖²/2 − ½ log m`` and ``s = max_i log φ_i``; the per-token terms cancel
    in ``log φ − s = ωᵢᵀx − max_j ωⱼᵀx``, so only the projection is touched at full width.
    """
    proj = torch.matmul(x, (omega * LOG2_E).transpose(1, 2))  # [B,H,N,m], in base-2 log units
    if not log_scale:
        return exponentiated_projection(proj), None
    return features_from_projection(proj, x.pow(2).sum(dim=-1, keepdim=True), num_features)




def features_from_projection(proj, squared_norm, num_features, out=None):
    """``(exp(a − a'), s)`` with ``a = ωᵢᵀx``, ``a' = max_i a_i`` and ``s = a' − ‖x‖²/2 − ½ log m``:
    the log-space FAVOR+ features of :func:`positive_random_features`, from ``proj = a·log₂ e``
    ``[..., m]`` (the factor folded into ω by the caller: the features are one ``exp2``) and
    ``‖x‖²`` ``[..., 1]``; written into ``out`` when given (no autograd)."""
    top = proj.amax(dim=-1, keepdim=True)
    # the same three roundings as top / log₂e − ½‖x‖² − ½ log m, in one new tensor
    shift = top.div(LOG2_E).sub_(squared_norm, alpha=0.5).sub_(0.5 * math.log(num_features))
    return torch.sub(proj, top, out=out).exp2_(), shift  # in place: one pass over a fresh tensor


def exponentiated_projection(proj, out=None):
    """``exp(a − a')``, the features of :func:`features_from_projection` without their log-scale (a query's,
    which the caller drops): ``‖x‖²`` is not needed. ``proj [..., ≥ m]`` may be wider: its first ``out``'s width
    (all of it when ``out`` is None) are the ``m`` projections."""
    proj = proj if out is None else proj[..., :out.shape[-1]]
    return torch.sub(proj, proj.amax(dim=-1, keepdim=True), out=out).exp2_()


@dataclass
class PerformerOptions(MethodOptions):
    num_features: int = field(default=64, metadata={"help": "m: random features per head.", "range": at_least(1)})
    seed: int = field(default=0, metadata={"help": "Seed of the random directions (offset by the layer index).",
                                           "range": at_least(0)})
    learnable: bool = field(default=False, metadata={"help": "Learn the directions (DARKFormer's LFK baseline)."})


@register_feature_map
class PerformerFeatureMap(FeatureMap):
    name = "performer"
    nonnegative = True
    chunkable = True
    writes_out = True
    skips_log_scale = True
    paper = "Performer FAVOR+ (Choromanski et al. 2021)"
    options_class = PerformerOptions
    in_default_comparison = True
    order = 3
    initial_gamma = 10.0  # hybrid attention's γ start: R = 32 + first before training, KL 0.912 against 2.302 at 0.1 (30: 0.911)
    card_note = ("**Performer** FAVOR+ (Choromanski et al., 2021) estimates the softmax kernel with "
                 "positive orthogonal random features, φ(x) = exp(ωᵢᵀx − ‖x‖²/2)/√m, whose dot product "
                 "is an unbiased estimate of exp(qᵀk). The random directions ω are drawn once, saved "
                 "with the model and never redrawn (they are learned when `learnable=True`).")

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__(head_dim, num_heads, **options)
        num_features, seed, learnable = self.settings.num_features, self.settings.seed, self.settings.learnable
        self.num_features = num_features
        self.feature_dim = self.num_features
        generator = seeded_generator(seed)
        omega = torch.stack([orthogonal_gaussian(self.num_features, self.head_dim, generator)
                             for _ in range(self.num_heads)])
        if learnable:
            self.omega = nn.Parameter(omega)
        else:
            self.register_buffer("omega", omega)

    def forward(self, x, mask=None, out=None, log_scale=True):
        omega = self.cast(self.omega, x)
        if out is None:
            return positive_random_features(x, omega, self.num_features, log_scale)
        # inference: the projection into the caller's buffer, its exp2 in place, ‖x‖² with no squared copy
        scaled = self.reused("scaled_omega", x.dtype, lambda: (omega * LOG2_E).transpose(1, 2), self.omega)
        proj = per_head_matmul(x, scaled, out)
        if not log_scale:
            return exponentiated_projection(proj, out=proj), None
        squared = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_()
        return features_from_projection(proj, squared, self.num_features, out=proj)
