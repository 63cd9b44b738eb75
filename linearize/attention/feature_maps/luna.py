"""LUNA: a learned kernel feature map (Shahbazi et al., seed luna-paper, §3.2 eq. 11, Listing 1).

    φ(x) = (h(x)/√M) · [ψ_ℓ(w_iᵀx + b_i)]_{i ≤ M, ℓ ≤ L} ∈ R^{M·L}

- ``W ∈ R^{M×d}``, ``b ∈ R^M``: projections shared across the heads of a layer (Listing 1,
  ``TaskSpecificProjections``), init ``randn/√d`` and 0.
- ψ: R → R^L, a one-hidden-layer ReLU MLP on the scalar ``u = wᵀx + b`` whose output is made
  non-negative by a final ReLU (Listing 1, ``ScalarMLP``, ``nonneg=True``). ``shared_mlp=True``:
  one MLP with L outputs; ``False``: L MLPs with one output each (Listing 1,
  ``shared_channels``). Both are stored as one batched set of weights
  ``[C, hidden]``/``[C, hidden, L/C]`` (C = 1 or L), so evaluation has no Python loop.
- ``envelope=True``: the envelope-gated variant of §5.4 / Table 5,
  ``φ(x) = envelope(x) ⊙ ψ(x)`` with a tokenwise gate ``envelope(x) = sigmoid(Ax + c) ∈ [0,1]^L``
  (the paper's default, and ours, is the un-gated ``h ≡ 1``, which wins in Table 5).
- ``ch_rms=True``: Listing 1's channel RMS scaling, ``ψ_ℓ ← ψ_ℓ · min(1, target / rms_ℓ)``.
  Listing 1 takes the RMS over the whole batch; here it is taken per sequence over real tokens
  only, so a sample's output depends neither on the other samples of the batch nor on padding.

All-zero features (every ψ output ReLU'd to zero) are possible; the core's guarded normaliser
turns such a query's row into uniform attention instead of 0/0.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .base import FeatureMap, register_feature_map


@register_feature_map
class LunaFeatureMap(FeatureMap):
    name = "luna"
    paper = "LUNA §3.2 eq. 11, Listing 1"

    def __init__(self, head_dim, num_heads=1, *, projections=8, channels=8, hidden=64, shared_mlp=True,
                 envelope=False, ch_rms=False, ch_rms_target=0.1):
        super().__init__(head_dim, num_heads, projections=projections, channels=channels, hidden=hidden,
                         shared_mlp=shared_mlp, envelope=envelope, ch_rms=ch_rms, ch_rms_target=ch_rms_target)
        m, channels, hidden = int(projections), int(channels), int(hidden)
        if min(m, channels, hidden) < 1:
            raise ValueError(f"luna: projections, channels and hidden must be >= 1, got {m}, {channels}, {hidden}")
        self.projections, self.channels, self.hidden = m, channels, hidden
        self.shared_mlp, self.use_envelope = bool(shared_mlp), bool(envelope)
        self.ch_rms, self.ch_rms_target = bool(ch_rms), float(ch_rms_target)
        self.feature_dim = m * channels
        d = self.head_dim
        self.proj_weight = nn.Parameter(torch.randn(m, d) / math.sqrt(d))
        self.proj_bias = nn.Parameter(torch.zeros(m))
        # ψ as C MLPs with O outputs each: C=1, O=L (shared) or C=L, O=1 (one MLP per channel).
        c, o = (1, channels) if self.shared_mlp else (channels, 1)
        # nn.Linear's default init: U(±1/√fan_in); fan_in is 1 for the first layer.
        self.mlp_w1 = nn.Parameter(torch.empty(c, hidden).uniform_(-1.0, 1.0))
        self.mlp_b1 = nn.Parameter(torch.empty(c, hidden).uniform_(-1.0, 1.0))
        bound = 1.0 / math.sqrt(hidden)
        self.mlp_w2 = nn.Parameter(torch.empty(c, hidden, o).uniform_(-bound, bound))
        self.mlp_b2 = nn.Parameter(torch.empty(c, o).uniform_(-bound, bound))
        if self.use_envelope:
            self.envelope_weight = nn.Parameter(torch.zeros(channels, d))
            self.envelope_bias = nn.Parameter(torch.zeros(channels))

    def project(self, x):
        """u = Wx + b: ``[B,H,N,d] -> [B,H,N,M]`` (shared across heads, Listing 1)."""
        return torch.einsum("bhnd,md->bhnm", x, self.cast(self.proj_weight, x)) + self.cast(self.proj_bias, x)

    def psi(self, u):
        """The channel functions ψ_ℓ(u): ``[...] -> [..., L]`` (ReLU MLP, non-negative output)."""
        w1, b1 = self.cast(self.mlp_w1, u), self.cast(self.mlp_b1, u)
        w2, b2 = self.cast(self.mlp_w2, u), self.cast(self.mlp_b2, u)
        hidden = torch.relu(u[..., None, None] * w1 + b1)  # [..., C, hidden]
        out = torch.einsum("...ch,cho->...co", hidden, w2) + b2  # [..., C, O]
        return torch.relu(out.flatten(-2))  # [..., L]

    def forward(self, x, mask=None):
        y = self.psi(self.project(x))  # [B,H,N,M,L]
        if self.use_envelope:
            gate = torch.sigmoid(torch.einsum("bhnd,ld->bhnl", x, self.cast(self.envelope_weight, x))
                                 + self.cast(self.envelope_bias, x))
            y = y * gate[..., None, :]
        if self.ch_rms:
            weight = torch.ones(y.shape[0], 1, y.shape[2], device=y.device) if mask is None else mask[:, None, :]
            weight = weight[..., None, None]  # [B,1,N,1,1]
            count = (weight.sum(dim=(1, 2, 3), keepdim=True) * y.shape[1] * y.shape[3]).clamp_min(1.0)
            rms = torch.sqrt((y.pow(2) * weight).sum(dim=(1, 2, 3), keepdim=True) / count + 1e-6)
            y = y * (self.ch_rms_target / (rms + 1e-6)).clamp(max=1.0)
        return (y / math.sqrt(self.projections)).flatten(-2), None
