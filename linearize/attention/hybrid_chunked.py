"""Hybrid attention for inference, chunk by chunk in reused buffers (the fast path of
``hybrid.hybrid_attention`` when no gradient is needed and the feature map is ``chunkable``).

The formula is ``hybrid``'s (LoLCATs, Zhang et al. 2024, §3.2, sliding window + linear attention, with
BigBird's blocked window, Zaheer et al. 2020, §2): exact softmax over the query's block of ``R`` tokens,
the two neighbouring blocks and the sinks, linear attention over the other keys, one normalisation:

    y_i = ( Σ_{j∈E_i} exp(s_ij − c_i) v_j  +  γ_h φ(q_i)ᵀ(S − S_{E_i}) + ε/n Σ_j v_j )
          / ( Σ_{j∈E_i} exp(s_ij − c_i)    +  γ_h φ(q_i)ᵀ(z − z_{E_i}) + ε ),

``S = Σ_j φ(k_j) v_jᵀ`` and ``z = Σ_j φ(k_j)`` over the real keys, ``S_{E_i}``, ``z_{E_i}`` the same sums over
the exact set. It is computed in two passes over chunks of whole blocks, as ``core``'s chunked linear
attention is (every chunk-sized temporary in ``core.scratch`` buffers, so a user's process does not map and
fault in new memory on every forward):

1. keys: the sums per block of ``R`` keys, ``Σ_{j∈block} φ(k_j)[v_j, 1]ᵀ`` (numerator and normaliser in one
   product, kept for the whole sequence: ``N/R`` blocks), and the sink keys' features (a log-scaled map's running
   max rescales what came before, as in ``core``). A sequence of one chunk (batch 1 up to 2,048 tokens at
   MiniLM's geometry) lays its keys and ``[v_j, 1]`` out as the halo of step 2 once, and the queries' exact part
   reads the same buffers; the keys' features are computed on that layout and every block's sums are one
   product written in place (no copy of the keys, values or features for the block sums);
2. queries: each chunk's blocks of queries with one block on either side (a "halo", the rows laid out one
   after another with one block of padding between them, so a block's window, the blocks before, at and
   after it, is 3R consecutive rows: a strided view). The exact part is one batched product for the scores
   against every window and one for ``Σ exp(s_ij − c_i)[v_j, 1]`` (no copy of the windows), per group of rows
   whose scores stay in cache (:data:`SCORES_BYTES`); the linear part
   one product of ``γ φ(q_i)`` (γ applied to the query features once) with ``[S − S_W, z − z_W]`` per block
   (every query of a block has one window: the global sums less the window's three block sums). A sink exact
   for the query (outside its window) moves from the linear part to the exact one: its score joins the max
   ``c_i`` and its weight ``exp(s_is − c_i) − γ φ(q_i)ᵀφ(k_s)`` multiplies ``[v_s, 1]``. Without padding, which
   keys and sinks each window must leave out follows from the length alone: slices, not masks.

No ``N×N`` tensor, no tensor of the whole sequence's features; O(N·(3R + D)·d) time.
"""

from __future__ import annotations

import math

import torch

from .core import (LOG2_E, cast_finite, chunk_tokens, features_in_buffer, features_of_chunk, guard_denominator,
                   log_scaled_chunk, query_options, real_key_mask, scratch, value_guard)


#: the per-block key sums (``N/R`` blocks of ``D × (d + 1)`` per row) live in a reused ``core.scratch`` buffer up to
#: this size (MiniLM geometry, batch 1: 13 MiB at 4,096 tokens, R = 32); larger ones are allocated per call, so a
#: process that once read a long batch does not keep hundreds of MiB
BLOCK_SUMS_KEPT_BYTES = 64 * 2**20


def chunked_hybrid_attention(q, k, v, feature_map, radius, sinks, gamma, key_padding_mask, scale, eps, chunk=None):
    """``hybrid.hybrid_attention`` without autograd for a chunkable map (module docstring); ``radius`` > 0
    (the block size ``R``), ``sinks`` None or the sink tokens' ``(positions [B, S], valid [B, S])``
    (``hybrid.sink_positions``), ``gamma [H]``. Returns a tensor shaped and typed like
    ``v`` (a view of an output stored ``[B, N, H, d]``, as ``core``'s chunked path returns). Its sums are
    float32 under autocast too (autocast would run the sink products in the lower precision, beside
    float32 buffers)."""
    with torch.autocast(q.device.type, enabled=False):
        return _chunked(q, k, v, feature_map, radius, sinks, gamma, key_padding_mask, scale, eps, chunk)


def _chunked(q, k, v, feature_map, radius, sinks, gamma, key_padding_mask, scale, eps, chunk):
    batch, heads, seq, _ = q.shape
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    block = int(radius)
    if chunk is None:  # core's chunk (measured best here too: docs/experiments/user-state, "Chunk size")
        chunk = chunk_tokens(batch * heads, feature_map.feature_dim, None, q.device)
    chunk = max(1, int(chunk) // block) * block
    mask = real_key_mask(key_padding_mask, batch, seq, k.device)
    gamma = gamma.float().repeat_interleave(batch).reshape(-1, 1, 1)  # rows h·B + b
    keys = _KeyPass(k, v, feature_map, mask, key_padding_mask is not None, scale, block, chunk, sinks, eps)
    out = torch.empty(batch, seq, heads, v.shape[-1], dtype=v.dtype, device=v.device)
    for start in range(0, seq, chunk):
        stop = min(start + chunk, seq)
        _query_chunk(q, keys, feature_map, mask, start, stop, gamma, eps, out[:, start:stop].permute(2, 0, 1, 3))
    return out.transpose(1, 2)


class _KeyPass:
    """What the queries need of the keys (pass 1 of the module docstring), rows head-major (``h·B + b``):
    ``blocks [rows, nb + 2, D, d + 1]`` (per block ``Σ φ(k_j)[v_j, 1]ᵀ``: the numerator's sums and, as the last
    column, the normaliser's; an empty block before the first and after the last), ``state [rows, D, d + 1]``
    (the same over every real key), ``bias [rows, 1, d]`` (``ε/n Σ_j v_j``), ``root`` (``√scale``: queries and
    keys both carry it, so their products are the scores and the queries are the feature map's input), and
    the sinks (``sink_*``) when there are any. ``whole``: the sequence is one chunk, and ``halo_keys``,
    ``halo_values`` and ``real`` hold its halo (:meth:`_whole_sequence`) for the queries."""

    def __init__(self, k, v, feature_map, mask, padded, scale, block, chunk, sinks, eps):
        batch, heads, seq, dim = k.shape
        self.k, self.v, self.mask, self.padded, self.root, self.block = k, v, mask, padded, scale**0.5, block
        self.batch, self.heads, self.rows, self.seq = batch, heads, batch * heads, seq
        count = -(-seq // block)
        dim_f, dim_v = feature_map.feature_dim, v.shape[-1]
        shape = (self.rows, count + 2, dim_f, dim_v + 1)
        if math.prod(shape) * 4 <= BLOCK_SUMS_KEPT_BYTES:  # kept between calls, as the chunk buffers are
            self.blocks = scratch("linearize.hybrid.blocks", shape, k.device)
        else:  # a whole long batch's sums: not held by the process after the call
            self.blocks = torch.empty(shape, device=k.device)
        self.sinks = sinks is not None
        self.around = (None, None)  # the mask of the last halo whose features were computed (_halo_features)
        if sinks is not None:
            self.sink_positions, self.sink_valid = sinks
            # without padding every sink is valid (but for the last of a one-token sequence: it is the first) and
            # every sequence's sinks are at the same tokens: their positions as numbers, for slices; else None
            every_valid = not padded and (seq > 1 or self.sink_positions.shape[1] == 1)
            self.sink_list = self.sink_positions[0].tolist() if every_valid else None
        self.whole = seq <= chunk
        if self.whole:
            real_v = self._whole_sequence(feature_map, mask)
        else:
            real_v = self._by_chunks(feature_map, mask, chunk)
        self.state = self.blocks[:, 1:count + 1].sum(dim=1)
        self.bias = value_guard(real_v, mask, padded, heads, eps)
        if sinks and not self.whole:
            self._gather_sink_keys()

    def _whole_sequence(self, feature_map, mask):
        """Pass 1 for a sequence of one chunk: the keys (times ``√scale``) and ``[v_j, 1]`` in the halo layout of
        the whole sequence (:func:`_halo`), kept for the queries' exact part, the keys' features computed on that
        layout (its padding blocks and padded keys zeroed), and every block's sums in one product written into
        :attr:`blocks` (whose first and last block are the halo's padding). Returns ``Σ_j v_j [rows, 1, d]``."""
        self.real = _real_keys(self, 0, self.seq)
        self.halo_keys = _halo(self.k, self, 0, self.seq, self.root, "linearize.hybrid.halo_keys")
        self.halo_values = _halo_values(self, 0, self.seq, self.real)
        phi, log = _halo_features(self.halo_keys, self, feature_map, self.mask, 0)  # [rows·(blocks + 2), R, D]
        by_head = phi.view(self.heads, self.batch, -1, phi.shape[-1])
        if log is not None:  # one chunk: the max over every real key, no rescaling
            keep = self.real.view(self.batch, 1, -1, 1)
            log_scaled_chunk(by_head.transpose(0, 1), log, keep, None, True)
        elif self.padded:
            by_head.mul_(self.real.view(1, self.batch, -1, 1))
        else:  # the halo's padding: the block before the sequence and what follows its last token
            by_head[:, :, :self.block].zero_()
            by_head[:, :, self.block + self.seq:].zero_()
        torch.bmm(phi.transpose(1, 2), self.halo_values, out=self.blocks.view(-1, *self.blocks.shape[2:]))
        if self.sinks:
            self._sinks_from_halo(by_head)
        return self.halo_values.view(self.rows, -1, self.halo_values.shape[-1])[..., :-1].sum(dim=1, keepdim=True)

    def _sinks_from_halo(self, features):
        """The sink keys' features, keys (times ``√scale``) and ``[v_s, 1]`` ``[rows, S, ·]``, read off the halo
        layouts of the whole sequence (``features [H, B, halo, D]``); zero where a sink is not valid."""
        index = (self.sink_positions + self.block)[None, :, :, None]  # halo rows: the sequence starts at R
        valid = None if self.sink_list is not None else self.sink_valid.repeat(self.heads, 1)[..., None]

        def gather(halo):
            by_head = halo.view(self.heads, self.batch, -1, halo.shape[-1])
            picked = by_head.gather(2, index.expand(self.heads, -1, -1, halo.shape[-1])).view(self.rows, -1,
                                                                                                halo.shape[-1])
            return picked if valid is None else picked.mul_(valid)

        self.sink_features, self.sink_keys = gather(features), gather(self.halo_keys)
        self.sink_rows = gather(self.halo_values)

    def _by_chunks(self, feature_map, mask, chunk):
        """Pass 1 chunk by chunk (a sequence longer than one chunk): each chunk's key features and block sums
        (:meth:`_add_blocks`); a log-scaled map's running max rescales the sums of the chunks before. Returns
        ``Σ_j v_j [rows, 1, d]``."""
        k, seq, block, heads, batch, padded = self.k, self.seq, self.block, self.heads, self.batch, self.padded
        sinks = self.sinks
        real_v = torch.zeros(self.rows, 1, self.v.shape[-1], device=k.device)
        if sinks:
            self.sink_features = torch.zeros(self.rows, self.sink_positions.shape[1], self.blocks.shape[2],
                                             device=k.device)
        self.blocks[:, 0].zero_()
        self.blocks[:, -1].zero_()
        top = None
        for start in range(0, seq, chunk):
            stop = min(start + chunk, seq)
            phi, log = features_of_chunk(feature_map, k, mask, start, stop, self.root)
            by_head = phi.view(heads, batch, stop - start, -1)
            if log is not None:
                top, rescale = log_scaled_chunk(by_head.transpose(0, 1), log, mask[:, None, start:stop, None], top,
                                                 padded)[1:]
                if rescale is not None:  # the sums so far were shifted by the smaller max
                    factor = rescale.transpose(0, 1).reshape(self.rows, 1, 1, 1)
                    self.blocks[:, 1:1 + start // block].mul_(factor)
                    if sinks:
                        self.sink_features.mul_(factor[..., 0])
            elif padded:
                by_head.mul_(mask[None, :, start:stop, None])
            real_v += self._add_blocks(phi, start, stop)
            if sinks:
                self._keep_sink_features(by_head, start, stop)
        return real_v

    def values(self, start, stop, length):
        """``[v_j, 1]`` of the keys ``start:stop`` (float32) in a ``[H, B, length, d + 1]`` buffer, head-major: zeros
        after them and on padded keys."""
        heads, batch, dim_v = self.heads, self.batch, self.v.shape[-1]
        values = scratch("linearize.hybrid.values", (heads, batch, length, dim_v + 1), self.v.device)
        values[:, :, :stop - start, :dim_v].copy_(self.v[:, :, start:stop].transpose(0, 1))
        values[:, :, :stop - start, dim_v].fill_(1.0)
        values[:, :, stop - start:].zero_()
        if self.padded:
            values[:, :, :stop - start].mul_(self.mask[None, :, start:stop, None])
        return values

    def _add_blocks(self, phi, start, stop):
        """Write the chunk's per-block sums (``phi [rows, c, D]``, its keys' features) into :attr:`blocks`;
        returns the chunk's value sum ``[rows, 1, d]``."""
        block, rows = self.block, self.rows
        length = -(-(stop - start) // block) * block
        if length != stop - start:  # the last chunk: whole blocks, zero features after the sequence
            padded = scratch("linearize.hybrid.keys", (rows, length, phi.shape[-1]), phi.device)
            padded[:, :stop - start].copy_(phi)
            padded[:, stop - start:].zero_()
            phi = padded
        values = self.values(start, stop, length).view(rows, length // block, block, -1)
        real_v = values[..., :-1].sum(dim=(1, 2)).unsqueeze(1)
        features = phi.view(rows, length // block, block, -1)
        first, count = 1 + start // block, length // block
        sums = torch.matmul(features.transpose(-1, -2), values,
                            out=scratch("linearize.hybrid.part", (rows, count, phi.shape[-1], values.shape[-1]),
                                        phi.device))
        self.blocks[:, first:first + count].copy_(sums)
        return real_v

    def _keep_sink_features(self, by_head, start, stop):
        """Keep the features of the sink keys that lie in this chunk (``by_head [H, B, c, D]``)."""
        inside = (self.sink_positions >= start) & (self.sink_positions < stop)  # [B, S]
        index = (self.sink_positions - start).clamp(0, stop - start - 1)
        picked = by_head.gather(2, index[None, :, :, None].expand(self.heads, -1, -1, by_head.shape[-1]))
        picked = picked.reshape(self.rows, self.sink_positions.shape[1], -1)
        self.sink_features = torch.where(inside.repeat(self.heads, 1)[..., None], picked, self.sink_features)

    def _gather_sink_keys(self):
        """The sink keys and values ``[rows, S, d]``, zero where a sink is not valid."""
        index = self.sink_positions[:, None, :, None]

        def gather(x):
            picked = x.gather(2, index.expand(self.batch, self.heads, -1, x.shape[-1])).float()
            return picked.transpose(0, 1).reshape(self.rows, self.sink_positions.shape[1], -1)

        self.sink_keys, self.sink_values = gather(self.k) * self.root, gather(self.v)
        valid = self.sink_valid.repeat(self.heads, 1)[..., None]
        self.sink_features = self.sink_features * valid
        self.sink_rows = torch.cat([self.sink_values, torch.ones_like(self.sink_values[..., :1])], dim=-1) * valid


def _halo(x, keys, start, stop, scale, name, ones=False):
    """``x``'s rows ``start - R .. stop + R`` (float32, times ``scale``; with ``ones``, a column of ones after
    them: ``[v_j, 1]``) as ``[rows, blocks + 2, R, w]`` (head-major), zeros outside the sequence; the view
    ``[rows * (blocks + 2), R, w]`` is a batch in which every block's neighbours are the blocks before and
    after it."""
    block, heads, batch, dim = keys.block, keys.heads, keys.batch, x.shape[-1]
    count = -(-(stop - start) // block)
    halo = scratch(name, (heads, batch, (count + 2) * block, dim + ones), x.device)
    low, high = max(0, start - block), min(keys.seq, start + (count + 1) * block)
    offset = low - (start - block)
    halo[:, :, :offset].zero_()
    part = halo[:, :, offset:offset + high - low]
    if scale != 1.0:  # the copy and the scaling in one pass
        torch.mul(x[:, :, low:high].transpose(0, 1), scale, out=part[..., :dim])
    else:
        part[..., :dim].copy_(x[:, :, low:high].transpose(0, 1))
    if ones:
        part[..., dim].fill_(1.0)
    halo[:, :, offset + high - low:].zero_()
    return halo.view(heads * batch * (count + 2), block, dim + ones)


def _halo_values(keys, start, stop, real):
    """The halo's ``[v_j, 1]`` (:func:`_halo`'s layout, ``[rows·(blocks + 2), R, d + 1]``): zeros outside the
    sequence and on padded keys (``real``: :func:`_real_keys`), so one product gives a window's numerator and
    its normaliser."""
    halo = _halo(keys.v, keys, start, stop, 1.0, "linearize.hybrid.halo_values", ones=True)
    if keys.padded:
        halo.view(keys.heads, keys.batch, -1, halo.shape[-1]).mul_(real.view(1, keys.batch, -1, 1))
    return halo


def _windows(halo, block):
    """The windows of ``halo [rows·(blocks + 2), R, w]`` (contiguous): ``[rows·(blocks + 2) − 2, 3R, w]``, window
    ``g`` the halo blocks ``g, g + 1, g + 2`` (the keys of the queries of block ``g + 1``). A view: consecutive
    blocks are consecutive in memory, so every window is a strided slice and one batched product reads them all
    without a copy (:func:`_exact_rows` says which of them it computes)."""
    total, _, width = halo.shape
    return halo.as_strided((total - 2, 3 * block, width), (block * width, width, 1), halo.storage_offset())


def _real_keys(keys, start, stop):
    """``[B, blocks + 2, R]`` bool: the halo's keys that are real (inside the sequence, not padding)."""
    block = keys.block
    count = -(-(stop - start) // block)
    low, high = max(0, start - block), min(keys.seq, start + (count + 1) * block)  # the sequence's tokens in it
    offset = low - (start - block)
    real = torch.zeros(keys.batch, (count + 2) * block, dtype=torch.bool, device=keys.mask.device)
    if keys.padded:
        real[:, offset:offset + high - low] = keys.mask[:, low:high].bool()
    else:
        real[:, offset:offset + high - low] = True
    return real.view(keys.batch, count + 2, block)


def _hide_keys(inner, keys, real, start):
    """``-inf`` on the window scores (``inner [n, blocks, R, 3R]``, each block's queries against its window, for
    ``n`` rows; the chunk's first query is the token ``start``) of keys that are not real (``real [n, blocks + 2,
    R]``: :func:`_real_keys` of each row's sequence). Without padding only the windows at the sequence's ends hold
    such keys, and only they are touched."""
    block, count = keys.block, inner.shape[1]
    if keys.padded:
        windows = real.view(real.shape[0], -1).unfold(1, 3 * block, block)  # [n, blocks, 3R]: block c + 1's window
        inner.masked_fill_(~windows[:, :, None, :], float("-inf"))
        return
    for index, g in enumerate(range(start // block, start // block + count)):  # block g: tokens (g − 1)R .. (g + 2)R − 1
        if g == 0:  # its window's first block lies before the sequence
            inner[:, index, :, :block].fill_(float("-inf"))
        if (g + 2) * block > keys.seq:  # and its end after it
            inner[:, index, :, keys.seq - (g - 1) * block:].fill_(float("-inf"))


def _near_sinks(keys, start, stop):
    """Without padding (``keys.sink_list``): ``(sink, first, last)`` for each sink, the halo blocks ``first ..
    last - 1`` of whose queries it is inside the window (not an exact sink for them; a slice of the halo)."""
    block = keys.block
    count = -(-(stop - start) // block)
    offset = start // block - 1  # halo block h is the sequence's block h + offset
    near = [(index, max(0, position // block - 1 - offset), min(count + 2, position // block + 2 - offset))
            for index, position in enumerate(keys.sink_list)]
    return [(index, first, last) for index, first, last in near if first < last]  # no slice with a negative end


def _exact_sinks(keys, start, stop):
    """``[B, blocks + 2, S]`` bool: the sink is exact for the halo block's queries beside their window (a real,
    distinct token two or more blocks away)."""
    block = keys.block
    count = -(-(stop - start) // block)
    here = torch.arange(count + 2, device=keys.mask.device) + start // block - 1  # the halo blocks' indices
    away = (here[None, :, None] - (keys.sink_positions // block)[:, None, :]).abs() > 1
    return away & keys.sink_valid[:, None, :]


def _exact_window_part(queries, keys, start, stop, real):
    """The exact part over each query's window: ``num [rows·(blocks + 2), R, d + 1]`` (``Σ_j exp(s_ij − c_i)[v_j,
    1]`` over the window's real keys: the numerator and, as the last column, the normaliser), the sinks'
    weights ``exp(s_is − c_i)`` (``[rows, halo, S]``, zero where a sink is not exact for the query; None without
    sinks) and their values ``[v_s, 1]``. ``c_i`` is the largest exact score of the query. The scores are formed
    times log₂ e, so every ``exp`` is an ``exp2`` (:data:`core.LOG2_E`). Each row's first and last halo block are
    padding: zero in ``num`` and in the sinks' weights. The rows run in groups (:data:`SCORES_BYTES`)."""
    total, block, _ = queries.shape
    rows = keys.rows
    size = total // rows  # halo blocks per row
    halo_keys = keys.halo_keys if keys.whole else _halo(keys.k, keys, start, stop, keys.root,
                                                        "linearize.hybrid.halo_keys")
    values = keys.halo_values if keys.whole else _halo_values(keys, start, stop, real)
    sink, exact, sink_top = _exact_sink_scores(queries, keys, start, stop) if keys.sinks else (None, None, None)
    num = scratch("linearize.hybrid.num", (total, block, keys.v.shape[-1] + 1), queries.device)
    top = scratch("linearize.hybrid.top", (rows, size - 2, block, 1), queries.device)
    real = real.repeat(keys.heads, 1, 1) if keys.padded else None  # [rows, blocks + 2, R]: row h·B + b is sequence b
    group = max(1, min(rows, SCORES_BYTES // (size * block * 3 * block * 4)))  # rows whose scores fit the budget
    for first in range(0, rows, group):
        part = slice(first * size, (first + group) * size)
        _exact_rows(queries[part], halo_keys[part], values[part], num[part], top[first:first + group],
                    None if sink_top is None else sink_top[first:first + group], keys, start,
                    None if real is None else real[first:first + group])
    _zero_padding_blocks(num, rows)
    if sink is not None:
        sink.view(rows, size, block, -1)[:, 1:-1].sub_(top).exp2_()
        _zero_padding_blocks(sink.view(total, block, -1), rows)
    return num, sink, exact


#: :func:`_exact_window_part` runs the rows (heads of sequences) in groups whose window scores (float32) take at most
#: this many bytes (at least one row a group): a reused buffer that stays in the cache between the passes over it.
#: Within a group the windows centred on the padding blocks between its rows (two of every ``blocks + 2``) are computed
#: and not used; a group per row skips them, more calls for small rows (measured: docs/experiments/hybrid/RESULTS.md §14)
SCORES_BYTES = 4 * 2**20


def _exact_rows(queries, halo_keys, values, num, top, sink_top, keys, start, real):
    """:func:`_exact_window_part` for a group of ``n`` consecutive rows (their halo blocks ``[n·(blocks + 2), R,
    ·]``): ``num``'s real query blocks and each query's ``c_i`` (times log₂ e) into ``top [n, blocks, R, 1]``
    (``sink_top``: the sinks' largest score, or None; ``real``: the rows' :func:`_real_keys` with padding, else None).
    With several rows the windows centred on the padding between them are computed too, and not used."""
    total, block, _ = queries.shape
    window = scratch("linearize.hybrid.scores", (total, block, 3 * block), queries.device)
    torch.baddbmm(window[1:-1], queries[1:-1], _windows(halo_keys, block).transpose(1, 2), beta=0, alpha=LOG2_E,
                  out=window[1:-1])  # the scores times log₂ e: exp2 below
    inner = window.view(top.shape[0], -1, block, 3 * block)[:, 1:-1]  # the scores of real query blocks
    _hide_keys(inner, keys, real, start)
    torch.amax(inner, dim=-1, keepdim=True, out=top)
    if sink_top is not None:
        torch.maximum(top, sink_top, out=top)
    if keys.padded:  # a query whose window and sinks hold no real key: c_i = 0 (without padding each has its own)
        top.masked_fill_(~torch.isfinite(top), 0.0)
    inner.sub_(top).exp2_()
    torch.bmm(window[1:-1], _windows(values, block), out=num[1:-1])


def _exact_sink_scores(queries, keys, start, stop):
    """The sink keys' scores (times log₂ e) ``[rows, halo, S]``, ``-inf`` where the sink is not exact for the
    query's block, which sinks are exact where (:func:`_near_sinks` or :func:`_exact_sinks`) and their largest
    score per query ``[rows, blocks, R, 1]``."""
    block, rows = keys.block, keys.rows
    sink = torch.bmm(queries.view(rows, -1, queries.shape[-1]), keys.sink_keys.transpose(1, 2)).mul_(LOG2_E)
    by_block = sink.view(keys.heads, keys.batch, -1, block, sink.shape[-1])
    if keys.sink_list is not None:
        exact = _near_sinks(keys, start, stop)
        for index, first, last in exact:
            by_block[:, :, first:last, :, index].fill_(float("-inf"))
    else:
        exact = _exact_sinks(keys, start, stop)
        by_block.masked_fill_(~exact[None, :, :, None, :], float("-inf"))
    return sink, exact, sink.view(rows, -1, block, sink.shape[-1])[:, 1:-1].amax(dim=-1, keepdim=True)


def _zero_padding_blocks(halo, rows):
    """Zero each row's first and last block of a ``[rows·(blocks + 2), R, w]`` halo layout."""
    by_row = halo.view(rows, -1, *halo.shape[1:])
    by_row[:, 0].zero_()
    by_row[:, -1].zero_()


def _query_chunk(q, keys, feature_map, mask, start, stop, gamma, eps, out):
    """Write the output rows of the queries ``start:stop`` into ``out``, a ``[H, B, stop - start, d]`` view of
    the output: the window's exact part (:func:`_exact_window_part`), plus ``γ φ(q_i)ᵀ(S − S_{W_i})`` per block
    (:func:`_outside_window`, numerator and normaliser in one product), less ``γ φ(q_i)ᵀφ(k_s)[v_s, 1]`` for each
    sink exact for the query (the sinks join its exact set: their linear terms leave it, their exact weights
    join it)."""
    block, rows = keys.block, keys.rows
    queries = _halo(q, keys, start, stop, keys.root, "linearize.hybrid.queries")
    num, sink, exact = _exact_window_part(queries, keys, start, stop, keys.real if keys.whole else
                                          _real_keys(keys, start, stop))
    phi = _halo_features(queries, keys, feature_map, mask, start,
                         **query_options(feature_map))[0]  # [rows·(blocks + 2), R, D]
    phi.view(rows, -1, phi.shape[-1]).mul_(gamma)  # γ φ(q_i): the linear part's γ, in the outside and sink terms
    num.baddbmm_(phi, _outside_window(keys, start, stop))
    if sink is not None:
        linear = torch.bmm(phi.view(rows, -1, phi.shape[-1]), keys.sink_features.transpose(1, 2))  # [rows, halo, S]
        by_block = linear.view(keys.heads, keys.batch, -1, block, linear.shape[-1])
        if keys.sink_list is not None:  # exact: (sink, halo blocks) where it is not
            for index, first, last in exact:
                by_block[:, :, first:last, :, index].zero_()
        else:
            by_block.mul_(exact[None, :, :, None, :])
        weights = sink.view(rows, -1, sink.shape[-1]).sub_(linear)
        num.view(rows, -1, num.shape[-1]).baddbmm_(weights, keys.sink_rows)
    num = num.view(rows, -1, num.shape[-1])
    values = num[..., :-1].add_(keys.bias)
    den = num[..., -1:].add_(eps)
    if keys.padded or not feature_map.nonnegative:  # else every query's own block is real: its exact part is >= 1
        den = guard_denominator(den, eps)
    size = stop - start
    values = values.view(keys.heads, keys.batch, -1, values.shape[-1])[:, :, block:block + size]
    den = den.view(keys.heads, keys.batch, -1, 1)[:, :, block:block + size]
    if out.dtype == torch.float32:
        torch.div(values, den, out=out)
    else:
        out.copy_(cast_finite(values / den, out.dtype))
def _halo_features(halo, keys, feature_map, mask, start, **extra):
    """``(features [rows·(blocks + 2), R, D], log-scale [B, H, halo, 1] or None)`` of a halo of queries or keys
    (:func:`_halo`, times ``√scale``: the map's input) starting ``R`` tokens before the token ``start``; the
    padding blocks' features are computed too (the caller zeroes or ignores them). The map sees the halo as a
    chunk of a sequence with ``R`` padded tokens before its first token, so a map that reads positions from the
    mask (cosFormer) places every token where it is. ``extra`` goes to the map (a query's ``core.query_options``)."""
    block, heads, batch = keys.block, keys.heads, keys.batch
    length = halo.shape[0] // keys.rows * block
    given = halo.view(heads, batch, length, -1).transpose(0, 1)
    if keys.around[0] != (start, length):  # the halo's mask: the keys' halo and the queries' of one chunk share it
        keys.around = (start, length), torch.nn.functional.pad(mask, (block, max(0, start + length - block
                                                                                  - mask.shape[1])))
    around = keys.around[1]
    phi, log = features_in_buffer(feature_map, given, around, start, "linearize.hybrid.features", **extra)
    return phi.view(-1, block, phi.shape[-1]), log


def _outside_window(keys, start, stop):
    """``[S − S_W, z − z_W]`` ``[rows·(blocks + 2), D, d + 1]`` for every halo query block (the padding blocks get
    zeros): the global sums less the window's three block sums (every query of a block has one window), the
    normaliser's as the last column (γ is on the query features: :func:`_query_chunk`). Three passes
    over the blocks' states: the window's three sums added, then taken from the global ones (~20% faster than three
    subtractions from the global sums on a 2-core CPU; a running total, ``torch.cumsum``, would need two passes but
    costs more than one here)."""
    rows, first, block = keys.rows, start // keys.block, keys.block
    count = -(-(stop - start) // block)
    dim_f, width = keys.state.shape[1:]
    both = scratch("linearize.hybrid.outside", (rows, count + 2, dim_f, width), keys.state.device)
    middle = both[:, 1:count + 1]  # the window's sums, then the global ones less them (the faster order, measured)
    torch.add(keys.blocks[:, first:first + count], keys.blocks[:, first + 1:first + count + 1], out=middle)
    torch.sub(keys.state[:, None], middle.add_(keys.blocks[:, first + 2:first + count + 2]), out=middle)
    both[:, 0].zero_()
    both[:, count + 1].zero_()
    return both.view(-1, dim_f, width)
