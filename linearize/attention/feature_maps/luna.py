"""LUNA: a learned kernel feature map (Shahbazi et al., "LUNA: Linear Universal Neural Attention with
Generalization Guarantees", §3.2 eq. 11, Listing 1).

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
- ``shared_projections=False`` (linearize's option, not the paper's): one ``W_h, b_h`` per head
  instead of one per layer; the same features and cost, H times the projection parameters.
- ``ch_rms=True``: Listing 1's channel RMS scaling, ``ψ_ℓ ← ψ_ℓ · min(1, target / rms_ℓ)``.
  Listing 1 takes the RMS over the whole batch; here it is taken per sequence over real tokens
  only, so a sample's output depends neither on the other samples of the batch nor on padding.

All-zero features (every ψ output ReLU'd to zero) are possible; the core's guarded normaliser
turns such a query's row into uniform attention instead of 0/0.

Speed: ψ before its output ReLU is exactly piecewise linear in u (one knot per hidden unit, at
``u = -b1/w1``), so :meth:`psi_lookup` evaluates it from a sorted-knot table (interval by a
uniform grid, then one slope/intercept fma) instead of materialising the ``hidden``-wide layer,
in inference and in training alike: the table's slopes and intercepts are smooth functions of
ψ's parameters on each interval, so the gradients flow through the table. Exact to float
rounding in value and gradient (tests/test_fast_paths.py); ~15-20x faster than the MLP in
inference and ~6x in a training step (forward + backward) at the default sizes. The MLP
(:meth:`psi_mlp`) stays the reference and serves tiny inputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from dataclasses import dataclass, field

from torch import nn

from ..core import is_tracing, scratch
from .base import (FeatureMap, MethodOptions, above, at_least, kept_while_unchanged, per_head_matmul,
                   register_feature_map)


def piecewise_linear(u, table, index):
    """``relu(slope[i]·u + intercept[i])``, ``i = index``: the value of :class:`PiecewiseLinear`
    (called directly when no gradient is needed: no autograd bookkeeping, no saved mask)."""
    channels = table.shape[1] // 2
    rows = table.index_select(0, index)  # [n, 2L]
    return torch.addcmul(rows[:, channels:], rows[:, :channels], u[:, None]).relu_()


def piecewise_linear_into(u, table, index, out):
    """:func:`piecewise_linear` written into ``out [n, L]`` (inference): each value's table row gathered
    into one reused buffer (``core.scratch``) instead of a new ``[n, 2L]``, then one fused multiply-add."""
    channels = table.shape[1] // 2
    rows = torch.index_select(table, 0, index, out=scratch("luna.table_rows", (u.numel(), 2 * channels), u.device,
                                                           table.dtype))
    return torch.addcmul(rows[:, channels:], rows[:, :channels], u[:, None], out=out).relu_()


class PiecewiseLinear(torch.autograd.Function):
    """``relu(slope[i]·u + intercept[i])`` with ``i = index`` (ψ by knot lookup, see
    :meth:`LunaFeatureMap.psi_lookup`): ``u [n]``, ``table [G+1, 2L]`` (L slopes, L intercepts),
    ``index [n]`` -> ``[n, L]``.

    Its backward gives ``∂/∂u = Σ_ℓ g_ℓ·slope_ℓ`` and the table's gradient as per-interval sums
    of ``g`` and ``g·u`` (one ``bincount`` each) instead of autograd's zero-filled slices and
    ``index_add``: ~2x less time per training step of ψ. Only the mask of positive outputs is
    kept for backward, not the ``[n, 2L]`` rows.
    """

    @staticmethod
    def forward(ctx, u, table, index):
        out = piecewise_linear(u, table, index)
        ctx.save_for_backward(u, table, index, out > 0)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        u, table, index, positive = ctx.saved_tensors
        channels = table.shape[1] // 2
        grad = grad * positive
        grad_u = grad_table = None
        if ctx.needs_input_grad[0]:
            grad_u = (grad * table[:, :channels].index_select(0, index)).sum(-1)
        if ctx.needs_input_grad[1]:
            bins = (index[:, None] * channels + torch.arange(channels, device=index.device)).reshape(-1)
            size = table.shape[0] * channels
            grad_slope = torch.bincount(bins, weights=(grad * u[:, None]).reshape(-1).float(),
                                         minlength=size)
            grad_intercept = torch.bincount(bins, weights=grad.reshape(-1).float(), minlength=size)
            grad_table = torch.cat([grad_slope.view(-1, channels), grad_intercept.view(-1, channels)], 1)
            grad_table = grad_table.to(table.dtype)
        return grad_u, grad_table, None


@dataclass
class LunaOptions(MethodOptions):
    projections: int = field(default=8, metadata={"help": "M: projections w_i^T x + b_i per layer.",
                                                  "range": at_least(1)})
    channels: int = field(default=8, metadata={"help": "L: outputs of psi per projection (features = M*L).",
                                               "range": at_least(1)})
    hidden: int = field(default=64, metadata={"help": "Hidden units of psi's scalar MLP.", "range": at_least(1)})
    shared_mlp: bool = field(default=True, metadata={
        "help": "One psi MLP with L outputs (true) or L MLPs with one output each (false)."})
    envelope: bool = field(default=False, metadata={"help": "The envelope-gated variant (LUNA §5.4, Table 5)."})
    ch_rms: bool = field(default=False, metadata={"help": "Listing 1's channel RMS scaling of psi."})
    ch_rms_target: float = field(default=0.1, metadata={"help": "The target RMS of that scaling.",
                                                        "range": above(0)})
    shared_projections: bool = field(default=True, metadata={
        "help": "One projection per layer (Listing 1) or, false, one per head (same cost)."})


@register_feature_map
class LunaFeatureMap(FeatureMap):
    name = "luna"
    nonnegative = True
    writes_out = True  # with the knot lookup (see forward)
    folds_input_scale = True
    paper = "LUNA §3.2 eq. 11, Listing 1"
    options_class = LunaOptions
    in_default_comparison = True
    order = 0
    card_note = ("**LUNA** learns the kernel's feature map. Each (scaled) query or key vector is projected onto "
                 "M directions shared by the heads of a layer, φ(x) = (1/√M)·[ψ(wᵢᵀx + bᵢ)]ᵢ, and every "
                 "projection passes through ψ, a small scalar MLP with non-negative outputs (L channels); "
                 "the projections and the MLPs are learned.")

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__(head_dim, num_heads, **options)
        config = self.settings
        m, channels, hidden = config.projections, config.channels, config.hidden  # each >= 1 (LunaOptions)
        self.projections, self.channels, self.hidden = m, channels, hidden
        self.shared_mlp, self.use_envelope = config.shared_mlp, config.envelope
        self.ch_rms, self.ch_rms_target = config.ch_rms, float(config.ch_rms_target)
        self.chunkable = not self.ch_rms  # the channel RMS is taken over the whole sequence
        self.feature_dim = m * channels
        d = self.head_dim
        self.shared_projections = config.shared_projections
        heads = () if self.shared_projections else (self.num_heads,)
        self.proj_weight = nn.Parameter(torch.randn(*heads, m, d) / math.sqrt(d))
        self.proj_bias = nn.Parameter(torch.zeros(*heads, m))
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

    def project(self, x, out=None, input_scale=None):
        """u = Wx + b: ``[B,H,N,d] -> [B,H,N,M]``; ``W`` shared across the heads (Listing 1) or,
        with ``shared_projections=False``, one ``W_h ∈ R^{M×d}`` per head (same cost). ``out``
        (inference): a buffer stored head-major (``per_head_matmul``) to write u into. ``input_scale`` s:
        the projection of s·x, s folded into the weight."""
        weight, bias = self.cast(self.proj_weight, x), self.cast(self.proj_bias, x)
        if input_scale is not None:
            weight = weight * input_scale
        if not self.shared_projections and x.shape[1] != weight.shape[0]:
            raise ValueError(f"luna: {x.shape[1]} heads given, the per-head projections were made for "
                             f"{weight.shape[0]}")
        if out is not None:  # one bmm over the heads, x read in place (one sequence's rows are a strided view)
            per_head = weight.t().expand(x.shape[1], -1, -1) if self.shared_projections else weight.transpose(1, 2)
            return per_head_matmul(x, per_head, out).add_(bias if self.shared_projections else bias.unsqueeze(1))
        if self.shared_projections:
            return F.linear(x, weight, bias)
        return torch.einsum("bhnd,hmd->bhnm", x, weight) + bias.unsqueeze(1)  # faster than a broadcast matmul

    def psi(self, u):
        """The channel functions ψ_ℓ(u): ``[...] -> [..., L]`` (ReLU MLP, non-negative output).

        For more than :attr:`lookup_min_values` values the exact knot lookup :meth:`psi_lookup`
        is used (in training too: it is differentiable in ``u`` and in every ψ parameter),
        otherwise the MLP :meth:`psi_mlp`.
        """
        return self.psi_lookup(u) if self.lookup_applies(u) else self.psi_mlp(u)

    def psi_mlp(self, u):
        """ψ evaluated as Listing 1's MLP (the reference form; differentiable in every parameter)."""
        w1, b1 = self.cast(self.mlp_w1, u), self.cast(self.mlp_b1, u)
        w2, b2 = self.cast(self.mlp_w2, u), self.cast(self.mlp_b2, u)
        hidden = torch.addcmul(b1, u[..., None, None], w1).relu()  # [..., C, hidden]
        if w1.shape[0] == 1:  # one shared MLP: a single matrix product
            out = torch.addmm(b2, hidden.reshape(-1, w1.shape[1]), w2[0]).view(*u.shape, 1, -1)
        else:
            out = torch.einsum("...ch,cho->...co", hidden, w2) + b2  # [..., C, O]
        return torch.relu(out.flatten(-2))  # [..., L]

    #: below this many values of u the MLP's fewer, larger ops win (measured on a 2-core CPU:
    #: the lookup is ~2x slower at 128 values, even at ~500, 3x faster at 4096, 15x at 12288;
    #: forward + backward in training, 6x faster at 196k values)
    lookup_min_values = 512

    def lookup_applies(self, u=None):
        """True when ``u`` (if given) is large enough for the knot lookup to be the faster path.

        The lookup is exact in value and in gradient (for ``u`` and every ψ parameter), so it
        serves training as well as inference. Not in a traced graph (``core.is_tracing``): its knot
        table is built from parameter values, so a traced model evaluates the MLP.
        """
        if is_tracing():
            return False
        return u is None or u.numel() >= self.lookup_min_values

    def psi_lookup(self, u, scale=1.0):
        """``scale·ψ(u)`` by knot lookup, exactly equal (up to float rounding) to the MLP.

        Each hidden unit ``relu(w1·u + b1)`` bends at ``u = -b1/w1``, so every ψ_ℓ before the
        output ReLU is piecewise linear with breakpoints at the union of the C MLPs' knots:
        sort them once, tabulate each interval's slope and intercept per channel, and evaluate
        ``relu(slope[i]·u + intercept[i])`` with ``i`` the number of knots ``<= u``
        (:meth:`knot_index`). No hidden layer of width ``hidden`` is materialised.

        Gradients: on interval ``i`` the active units are fixed, so the slope ``Σ_h on[i,h]·w1_h·w2_h``
        and intercept ``Σ_h on[i,h]·b1_h·w2_h + b2`` are smooth in the parameters; the table is
        built from them under autograd whenever a ψ parameter needs a gradient, and the gather's
        backward sums each interval's output gradients (what the MLP's backward computes value
        by value, away from the measure-zero knots themselves).
        """
        table, structure = self._psi_table(u.dtype, u.device, float(scale))
        flat = u.reshape(-1)
        index = self.knot_index(flat.detach(), structure)
        if torch.is_grad_enabled() and (flat.requires_grad or table.requires_grad):
            out = PiecewiseLinear.apply(flat, table, index)  # [n, L]
        else:
            out = piecewise_linear(flat, table, index)
        return out.view(*u.shape, self.channels)

    @staticmethod
    def knot_index(flat, lookup):
        """``#{knots <= u}`` for each value of ``flat`` (what ``bucketize(..., right=True)`` gives).

        With a grid (see :meth:`_knot_grid`): the value's grid cell gives the count of the knots
        left of the cell, and a comparison or two with the knots in and around the cell adds the
        rest; several times faster than ``bucketize``'s binary search, and exact whatever the
        rounding of the cell arithmetic (cells overlap their neighbours by a margin far above it).
        """
        grid = lookup["grid"]
        if grid is None:
            return torch.bucketize(flat, lookup["knots"], right=True)
        cell = torch.mul(flat, grid["inverse_width"]).add_(grid["offset"])  # u/w + offset
        cell = cell.nan_to_num_(0.0).clamp_(0.0, grid["cells"] + 1).to(torch.int32)  # floor (>= 0)
        index = grid["left"].index_select(0, cell)
        for knots in grid["candidates"]:  # NaN pads a cell with fewer knots: never counted
            index += flat >= knots.index_select(0, cell)
        return index.to(torch.int32)

    @staticmethod
    def knot_index_into(flat, lookup):
        """:meth:`knot_index` for inference, every temporary in a reused buffer (``core.scratch``):
        the cells, the counts and knots gathered for them, the comparisons and the int32 result. Each
        gather reads one contiguous column of the grid (a comparison with a strided column of one
        ``[cells, 1 + candidates]`` table took ~15x longer on a 2-core CPU)."""
        n, device = flat.numel(), flat.device
        index = scratch("luna.index", (n,), device, torch.int32)
        grid = lookup["grid"]
        if grid is None:
            return torch.bucketize(flat, lookup["knots"], right=True, out_int32=True, out=index)
        cell = scratch("luna.cell", (n,), device, flat.dtype)
        torch.mul(flat, grid["inverse_width"], out=cell).add_(grid["offset"])  # u/w + offset
        cells = scratch("luna.cells", (n,), device, torch.int32)
        cells.copy_(cell.nan_to_num_(0.0).clamp_(0.0, grid["cells"] + 1))  # floor (>= 0)
        count = torch.index_select(grid["left"], 0, cells, out=cell)  # the cell's float no longer needed
        knots, above = scratch("luna.knots", (n,), device, flat.dtype), scratch("luna.above", (n,), device, flat.dtype)
        for column in grid["candidates"]:  # NaN pads a cell with fewer knots: never counted
            # the comparison written as 0/1 in the count's dtype (adding a bool tensor makes a float copy)
            count += torch.ge(flat, torch.index_select(column, 0, cells, out=knots), out=above)
        return index.copy_(count)

    def _psi_params(self):
        return (self.mlp_w1, self.mlp_b1, self.mlp_w2, self.mlp_b2)

    def _cached(self, name, key, build):
        """``build()``, kept until ``key`` (dtype, device, scale...) or a ψ parameter changes."""
        return kept_while_unchanged(self, name, key, build, self._psi_params())

    def _knot_structure(self, dtype, device):
        """The parameter-independent-in-value part of the lookup (no gradients): the sorted knots
        of all C MLPs (in ``dtype``), the grid of :meth:`_knot_grid`, and ``on [G+1, C, hidden]``
        (float64): which hidden units are active on each of the G+1 intervals."""
        return self._cached("_knot_cache", (dtype, device), lambda: self._build_knot_structure(dtype, device))

    @torch.no_grad()
    def _build_knot_structure(self, dtype, device):
        w1, b1 = (p.detach().to(device="cpu", dtype=torch.float64) for p in (self.mlp_w1, self.mlp_b1))
        bends = w1 != 0
        knots = torch.where(bends, -b1 / torch.where(bends, w1, torch.ones_like(w1)), torch.inf)  # [C, hidden]
        merged = knots[bends].sort().values  # [G]
        # Interval g is [merged[g-1], merged[g]). count[c, h] = #merged knots <= unit (c, h)'s knot,
        # so that knot lies at or left of interval g exactly when count <= g. A unit is on there
        # iff its knot is left (w1 > 0) or right (w1 < 0) of it; at a knot its pre-activation is 0.
        count = torch.searchsorted(merged, knots.contiguous(), right=True)  # [C, hidden]
        interval = torch.arange(merged.numel() + 1)[:, None, None]  # [G+1, 1, 1]
        on = torch.where(w1 > 0, count <= interval, count > interval) & bends  # [G+1, C, hidden]
        knots_cast = merged.to(dtype)  # the comparisons run in the input's dtype
        return {"knots": knots_cast.to(device), "grid": self._knot_grid(knots_cast, device),
                "on": on.to(torch.float64), "flat": (~bends).to(torch.float64)}

    @staticmethod
    def _table_from(structure, w1, b1, w2, b2):
        """``[G+1, 2L]``: per interval the L slopes then the L intercepts (see :meth:`psi_lookup`)."""
        on, flat = structure["on"], structure["flat"]
        slope = torch.einsum("gch,cho->gco", on, w1[..., None] * w2)  # [G+1, C, O]
        constant = (torch.relu(b1) * flat)[..., None].mul(w2).sum(1) + b2  # [C, O]: units with w1 = 0
        intercept = torch.einsum("gch,cho->gco", on, b1[..., None] * w2) + constant
        return torch.cat([slope.flatten(1), intercept.flatten(1)], dim=1)

    def _psi_table(self, dtype, device, scale):
        """``(table [G+1, 2L] times scale, knot structure)``. Without gradients for ψ's
        parameters the table is built in float64 and cached until a parameter changes; with
        them it is rebuilt (a few hundred numbers) under autograd on every call."""
        structure = self._knot_structure(dtype, device)
        if torch.is_grad_enabled() and any(p.requires_grad for p in self._psi_params()):
            params = [p.to(device) for p in self._psi_params()]
            cast = {"on": structure["on"].to(device=device, dtype=params[0].dtype),
                    "flat": structure["flat"].to(device=device, dtype=params[0].dtype)}
            return (self._table_from(cast, *params) * scale).to(dtype), structure

        def build():
            with torch.no_grad():
                params = [p.detach().to(device="cpu", dtype=torch.float64) for p in self._psi_params()]
                table = self._table_from(structure, *params) * scale
            return table.to(device=device, dtype=dtype).contiguous()

        return self._cached("_table_cache", (dtype, device, scale), build), structure

    @staticmethod
    def _knot_grid(knots, device, max_candidates=4, max_cells=2**16):
        """A uniform grid over the knots for :meth:`knot_index`, or None (then ``bucketize``).

        The cell of ``u`` is ``floor(u·(1/w) + offset)`` clamped to ``[0, C+1]``, evaluated in
        ``knots.dtype`` with ``offset = 1 − low/w``: cell 0 is left of the lowest knot, cells
        1..C split ``[low, low + C·w)``, cell C+1 is the rest. Per cell: ``left``, the number of knots
        left of the cell minus a margin, and ``candidates``, the knots within the cell plus the margin
        on both sides (padded with NaN), one contiguous column per candidate (a gather each). The
        rounding error of the cell arithmetic (a multiply, then an add) is below
        ``(2·max|knot|/w + C)·2⁻²⁴`` cells, kept below 1/16 (C <= 2^16, max|knot|/w <= 2^19);
        the margin is a quarter cell. The C (a power of two up to ``max_cells``) with the fewest
        candidates per cell is chosen (the smallest among ties); more than ``max_candidates``: no
        grid.
        """
        finite = knots[torch.isfinite(knots)].to(torch.float64)
        if finite.numel() == 0 or knots.dtype not in (torch.float32, torch.float64):
            return None
        left_infinite = int((knots == -torch.inf).sum())
        low, high = float(finite[0]), float(finite[-1])
        span = high - low if high > low else max(abs(low), 1.0)
        largest = max(abs(low), abs(high), span)
        max_cells = min(max_cells, int(span / largest * 2**19))
        best = None
        cells = max(8, 1 << (8 * finite.numel() - 1).bit_length())
        while cells <= max_cells:
            inverse_width = float(torch.tensor(cells / span, dtype=knots.dtype))  # as the lookup rounds them
            offset = float(torch.tensor(1.0 - low * inverse_width, dtype=knots.dtype))
            edges = (torch.arange(1, cells + 2, dtype=torch.float64) - offset) / inverse_width  # cells 1..C+1 start
            margin = 0.25 / inverse_width
            start = torch.cat([torch.tensor([-torch.inf], dtype=torch.float64), edges - margin])  # cells 0..C+1
            stop = torch.cat([edges + margin, torch.tensor([torch.inf], dtype=torch.float64)])
            base = torch.searchsorted(finite, start, right=False)  # knots < start
            end = torch.searchsorted(finite, stop, right=True)  # knots <= stop
            widest = int((end - base).max())
            if best is None or widest < best[0]:
                best = (widest, cells, offset, inverse_width, base, end)
            if widest <= 1:
                break
            cells *= 2
        if best is None or best[0] > max_candidates:
            return None
        widest, cells, offset, inverse_width, base, end = best
        # pads are NaN: `u >= NaN` is False for every u, +inf included
        padded = torch.cat([finite, torch.full((widest,), torch.nan, dtype=torch.float64)])
        offsets = torch.arange(widest)[:, None]
        candidates = torch.where(base[None, :] + offsets < end[None, :], padded[base[None, :] + offsets], torch.nan)
        scalar = dict(dtype=knots.dtype, device=device)
        # per cell: the knots left of it (a count, exact in float), then its candidates, each a column of its own
        return {"offset": offset, "inverse_width": inverse_width, "cells": cells,
                "left": (base + left_infinite).to(**scalar), "candidates": tuple(c.to(**scalar) for c in candidates)}

    def forward(self, x, mask=None, out=None, input_scale=None):
        plain = not self.use_envelope and not self.ch_rms
        if out is not None and plain and self.lookup_applies() and \
                x.numel() // x.shape[-1] * self.projections >= self.lookup_min_values:
            return self._features_into(x, out, input_scale), None
        if input_scale is not None:  # the features of input_scale · x (the envelope reads x too)
            x = x * input_scale
        u = self.project(x)
        if plain and self.lookup_applies(u):
            # the 1/√M factor is folded into the lookup table: relu(a)/s = relu(a/s)
            return self.psi_lookup(u, 1.0 / math.sqrt(self.projections)).flatten(-2), None
        y = self.psi(u)  # [B,H,N,M,L]
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

    def _features_into(self, x, out, input_scale=None):
        """Inference by the knot lookup: φ(x) written into ``out [B,H,N,M·L]`` (stored head-major,
        see ``per_head_matmul``), every temporary in a reused buffer (``core.scratch``): u, the knot
        indices, the gathered slopes. The values of :meth:`psi_lookup`, 1/√M folded in the table."""
        batch, heads, seq, _ = x.shape
        u = scratch("luna.u", (heads, batch, seq, self.projections), x.device, x.dtype).transpose(0, 1)
        flat = self.project(x, out=u, input_scale=input_scale).transpose(0, 1).reshape(-1)  # a view: u is head-major
        table, structure = self._psi_table(flat.dtype, flat.device, 1.0 / math.sqrt(self.projections))
        index = self.knot_index_into(flat, structure)
        piecewise_linear_into(flat, table, index, out.transpose(0, 1).view(-1, self.channels))
        return out

    @torch.no_grad()
    def probe(self, inputs, max_samples=20000, points=200, bins=40):
        """LUNA Fig. 3's data: the channels ψ_ℓ(u) on ``points`` values spanning the empirical range
        of u = wᵢᵀx + bᵢ over ``inputs`` (the 0.5-99.5 % quantiles, 10 % margin; at most
        ``max_samples`` values, a seeded sample), and u's histogram in ``bins`` bins:
        ``{"grid": [points], "psi": [points][L], "hist_edges": [bins + 1], "hist_counts": [bins]}``."""
        import numpy as np

        u = torch.cat([self.project(x).flatten().cpu() for x in inputs])
        if u.numel() > max_samples:
            u = u[torch.randperm(u.numel(), generator=torch.Generator().manual_seed(0))[:max_samples]]
        lo, hi = torch.quantile(u, 0.005).item(), torch.quantile(u, 0.995).item()
        pad = 0.1 * (hi - lo + 1e-6)
        grid = torch.linspace(lo - pad, hi + pad, points)
        psi = self.psi(grid.to(self.mlp_w1.dtype).to(self.mlp_w1.device)).float().cpu()
        counts, edges = np.histogram(u.numpy(), bins=bins, range=(lo - pad, hi + pad))
        return {"grid": grid.tolist(), "psi": psi.tolist(), "hist_edges": edges.tolist(),
                "hist_counts": counts.tolist()}
