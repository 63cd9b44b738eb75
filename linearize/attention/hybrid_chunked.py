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

1. keys: each chunk's features and their sums per block of ``R`` keys, ``Σ_{j∈block} φ(k_j)[v_j, 1]ᵀ``
   (numerator and normaliser in one product, kept for the whole sequence: ``N/R`` blocks), and the sink
   keys' features (a log-scaled map's running max rescales what came before, as in ``core``);
2. queries: each chunk's blocks of queries with one block of keys on either side (a "halo"): the scores
   against the query's own key block (and the sink keys, appended to it) and its two neighbours are three
   batched products over all blocks of all rows at once (the rows laid out one after another, with one
   block of padding between them, so the neighbour of a block is simply the next or previous one in the
   batch); the linear part is one product with ``[S − S_E, z − z_E]`` per block (every query of a block has
   one exact set: the global sums less the window's three block sums and the exact sinks' terms).

No ``N×N`` tensor, no tensor of the whole sequence's features; O(N·(3R + D)·d) time.
"""

from __future__ import annotations

import math

import torch

from .core import (cast_finite, chunk_tokens, features_of_chunk, guard_denominator, log_scaled_chunk, real_key_mask,
                   scratch)


#: the per-block key sums (``N/R`` blocks of ``D × (d + 1)`` per row) live in a reused ``core.scratch`` buffer up to
#: this size (MiniLM geometry, batch 1: 13 MiB at 4,096 tokens, R = 32); larger ones are allocated per call, so a
#: process that once read a long batch does not keep hundreds of MiB
BLOCK_SUMS_KEPT_BYTES = 64 * 2**20


def chunked_hybrid_attention(q, k, v, feature_map, radius, sinks, gamma, key_padding_mask, scale, eps, chunk=None):
    """``hybrid.hybrid_attention`` without autograd for a chunkable map (module docstring); ``radius`` > 0
    (the block size ``R``), ``sinks`` None or the sink tokens' ``(positions [B, S], valid [B, S])``
    (``hybrid.sink_positions``), ``gamma [H]``. Returns a tensor shaped and typed like
    ``v`` (a view of an output stored ``[B, N, H, d]``, as ``core``'s chunked path returns)."""
    batch, heads, seq, _ = q.shape
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    block = int(radius)
    if chunk is None:  # core's chunk (measured best here too: docs/experiments/user-state, "Chunk size")
        chunk = chunk_tokens(batch * heads, feature_map.feature_dim, None)
    chunk = max(1, int(chunk) // block) * block
    mask = real_key_mask(key_padding_mask, batch, seq, k.device)
    keys = _KeyPass(k, v, feature_map, mask, key_padding_mask is not None, scale, block, chunk, sinks, eps)
    gamma = gamma.float().repeat_interleave(batch).reshape(-1, 1, 1)  # rows h·B + b (the halo repeats it per block)
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
    the sinks (``sink_*``) when there are any."""

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
        self.blocks[:, 0].zero_()
        self.blocks[:, count + 1].zero_()
        self.sinks = sinks is not None
        if sinks is not None:
            self.sink_positions, self.sink_valid = sinks
            self.sink_features = torch.zeros(self.rows, self.sink_positions.shape[1], dim_f, device=k.device)
        real_v = torch.zeros(self.rows, 1, dim_v, device=k.device)
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
        self.state = self.blocks[:, 1:count + 1].sum(dim=1)
        n_real = mask.sum(dim=1).repeat(heads).reshape(self.rows, 1, 1)
        self.bias = real_v.mul_(eps / n_real.clamp_min(1.0))
        if sinks:
            self._gather_sink_keys()

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
        features = phi.view(rows, length // block, block, -1)
        first, count = 1 + start // block, length // block
        sums = torch.matmul(features.transpose(-1, -2), values,
                            out=scratch("linearize.hybrid.part", (rows, count, phi.shape[-1], values.shape[-1]),
                                        phi.device))
        self.blocks[:, first:first + count].copy_(sums)
        return values[..., :-1].sum(dim=(1, 2)).unsqueeze(1)

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
        self.sink_values = self.sink_values * valid


def _halo(x, keys, start, stop, scale, name):
    """``x``'s rows ``start - R .. stop + R`` (float32, times ``scale``) as ``[rows, blocks + 2, R, d]``
    (head-major), zeros outside the sequence; the view ``[rows * (blocks + 2), R, d]`` is a batch in which
    every block's neighbours are the blocks before and after it."""
    block, heads, batch = keys.block, keys.heads, keys.batch
    count = -(-(stop - start) // block)
    halo = scratch(name, (heads, batch, (count + 2) * block, x.shape[-1]), x.device)
    low, high = max(0, start - block), min(keys.seq, start + (count + 1) * block)
    offset = low - (start - block)
    halo[:, :, :offset].zero_()
    part = halo[:, :, offset:offset + high - low]
    part.copy_(x[:, :, low:high].transpose(0, 1))
    if scale != 1.0:
        part.mul_(scale)
    halo[:, :, offset + high - low:].zero_()
    return halo.view(heads * batch * (count + 2), block, x.shape[-1])


def _real_keys(keys, start, stop):
    """``[B, blocks + 2, R]`` bool: the halo's keys that are real (inside the sequence, not padding)."""
    block = keys.block
    count = -(-(stop - start) // block)
    positions = torch.arange(start - block, start + (count + 1) * block, device=keys.mask.device)
    inside = (positions >= 0) & (positions < keys.seq)
    real = torch.zeros(keys.batch, positions.shape[0], dtype=torch.bool, device=keys.mask.device)
    real[:, inside] = keys.mask[:, positions[inside]].bool()
    return real.view(keys.batch, count + 2, block)


def _hide_keys(own, left, right, keys, real):
    """``-inf`` on the scores of keys that are not real (``real [B, blocks + 2, R]``: :func:`_real_keys`): every
    halo block's keys as the own block of its queries, the left block of the next block's and the right block
    of the previous one's. Without padding only the blocks at the sequence's ends hold such keys, and only
    they are touched."""
    block = keys.block
    shape = (keys.heads, keys.batch, -1, block, own.shape[-1])
    own, left, right = own.view(shape)[..., :block], left.view(shape[:-1] + (block,)), right.view(shape[:-1] + (block,))
    holes = (~real).any(dim=2).any(dim=0).nonzero().flatten().tolist() if not keys.padded else None
    if holes is None or len(holes) > 4:
        hidden = ~real[None, :, :, None, :]
        own.masked_fill_(hidden, float("-inf"))
        left[:, :, 1:].masked_fill_(hidden[:, :, :-1], float("-inf"))
        right[:, :, :-1].masked_fill_(hidden[:, :, 1:], float("-inf"))
        return
    last = real.shape[1] - 1
    for index in holes:  # halo block ``index`` holds keys that are not real
        hidden = ~real[None, :, index, None, :]
        own[:, :, index].masked_fill_(hidden, float("-inf"))
        if index < last:
            left[:, :, index + 1].masked_fill_(hidden, float("-inf"))
        if index > 0:
            right[:, :, index - 1].masked_fill_(hidden, float("-inf"))


def _window_scores(queries, halo_keys, keys, start, stop, real):
    """The three score blocks ``(own, left, right)`` of every halo query block: ``own [rows·(blocks + 2), R,
    R + S]`` against its own key block and the ``S`` sink keys (``-inf`` where a sink is not exact for the
    block), ``left`` and ``right`` ``[rows·(blocks + 2), R, R]`` against the blocks before and after it;
    ``-inf`` on keys that are not real (``real``: :func:`_real_keys`). The first and last block of each row are
    padding (their rows are not used)."""
    total, block, _ = queries.shape
    own_keys = _with_sinks(halo_keys, keys, "keys")
    own = scratch("linearize.hybrid.own", (total, block, own_keys.shape[1]), queries.device)
    left = scratch("linearize.hybrid.left", (total, block, block), queries.device)
    right = scratch("linearize.hybrid.right", (total, block, block), queries.device)
    torch.bmm(queries, own_keys.transpose(1, 2), out=own)
    torch.bmm(queries[1:], halo_keys[:-1].transpose(1, 2), out=left[1:])
    torch.bmm(queries[:-1], halo_keys[1:].transpose(1, 2), out=right[:-1])
    left[0].fill_(float("-inf"))
    right[-1].fill_(float("-inf"))
    _hide_keys(own, left, right, keys, real)
    if keys.sinks:
        exact = _exact_sinks(keys, start, stop)  # [B, blocks + 2, S]
        sink_scores = own.view(keys.heads, keys.batch, -1, block, own.shape[-1])[..., block:]
        sink_scores.masked_fill_(~exact[None, :, :, None, :], float("-inf"))
    return own, left, right


def _with_sinks(halo, keys, name):
    """``halo [rows·(blocks + 2), R, d]`` with the row's sink keys (or values) appended to every block:
    ``[rows·(blocks + 2), R + S, d]``; ``halo`` itself without sinks."""
    if not keys.sinks:
        return halo
    total, block, dim = halo.shape
    sinks = keys.sink_keys if name == "keys" else keys.sink_values  # [rows, S, d]
    both = scratch(f"linearize.hybrid.own_{name}", (total, block + sinks.shape[1], dim), halo.device)
    both[:, :block].copy_(halo)
    both[:, block:].view(keys.rows, -1, sinks.shape[1], dim).copy_(sinks[:, None])
    return both


def _exact_sinks(keys, start, stop):
    """``[B, blocks + 2, S]`` bool: the sink is exact for the halo block's queries beside their window (a real,
    distinct token two or more blocks away)."""
    block = keys.block
    count = -(-(stop - start) // block)
    here = torch.arange(count + 2, device=keys.mask.device) + start // block - 1  # the halo blocks' indices
    away = (here[None, :, None] - (keys.sink_positions // block)[:, None, :]).abs() > 1
    return away & keys.sink_valid[:, None, :]


def _query_chunk(q, keys, feature_map, mask, start, stop, gamma, eps, out):
    """Write the output rows of the queries ``start:stop`` into ``out``, a ``[H, B, stop - start, d]`` view of
    the output."""
    block, rows = keys.block, keys.rows
    count = -(-(stop - start) // block)
    queries = _halo(q, keys, start, stop, keys.root, "linearize.hybrid.queries")
    halo_keys = _halo(keys.k, keys, start, stop, keys.root, "linearize.hybrid.halo_keys")
    halo_values = _halo(keys.v, keys, start, stop, 1.0, "linearize.hybrid.halo_values")
    real = _real_keys(keys, start, stop)
    if keys.padded:
        halo_values.mul_(real.repeat(keys.heads, 1, 1).view(-1, block, 1))
    own, left, right = _window_scores(queries, halo_keys, keys, start, stop, real)
    top = torch.maximum(torch.maximum(own.amax(dim=-1, keepdim=True), left.amax(dim=-1, keepdim=True)),
                        right.amax(dim=-1, keepdim=True))
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    own.sub_(top).exp_()
    left.sub_(top).exp_()
    right.sub_(top).exp_()
    num = torch.bmm(own, _with_sinks(halo_values, keys, "values"))
    num[1:].baddbmm_(left[1:], halo_values[:-1])
    num[:-1].baddbmm_(right[:-1], halo_values[1:])
    den = own.sum(dim=-1, keepdim=True).add_(left.sum(dim=-1, keepdim=True)).add_(right.sum(dim=-1, keepdim=True))
    phi = _query_features(queries, keys, feature_map, mask, start)  # [rows·(blocks + 2), R, D]
    linear = torch.bmm(phi, _outside_exact(keys, start, stop))  # numerator and normaliser in one product
    gamma = gamma.repeat_interleave(count + 2, 0)  # per halo block
    num = num.addcmul_(linear[..., :-1], gamma).view(rows, -1, num.shape[-1])
    den = den.addcmul_(linear[..., -1:], gamma).view(rows, -1, 1)
    num, den = num.add_(keys.bias), guard_denominator(den.add_(eps), eps)
    size = stop - start
    num = num.view(keys.heads, keys.batch, -1, num.shape[-1])[:, :, block:block + size]
    den = den.view(keys.heads, keys.batch, -1, 1)[:, :, block:block + size]
    if out.dtype == torch.float32:
        torch.div(num, den, out=out)
    else:
        out.copy_(cast_finite(num.div_(den), out.dtype))


def _query_features(queries, keys, feature_map, mask, start):
    """The features of the halo queries ``[rows·(blocks + 2), R, D]`` (``queries`` times ``√scale``, the map's
    input; the padding blocks' rows are not used). The map sees the halo as a chunk of a sequence with ``R``
    padded tokens before its first token, so a map that reads positions from the mask (cosFormer) places
    every token where it is."""
    block, heads, batch = keys.block, keys.heads, keys.batch
    length = queries.shape[0] // keys.rows * block
    given = queries.view(heads, batch, length, -1).transpose(0, 1)
    around = torch.nn.functional.pad(mask, (block, max(0, start + length - block - mask.shape[1])))  # halo: start ..
    out = scratch("linearize.hybrid.query_features", (heads, batch, length, feature_map.feature_dim), queries.device)
    if feature_map._forward_hooks or feature_map._forward_pre_hooks:
        given, out = given.clone(), None  # a hook may keep its tensors: none of them in a buffer
    if getattr(feature_map, "writes_out", False) and out is not None:
        phi, _ = feature_map.chunk_features(given, around, start, out=out.transpose(0, 1))
    else:
        phi, _ = feature_map.chunk_features(given, around, start)  # the query's log-scale cancels
    rows = phi.transpose(0, 1)
    if out is None or rows.data_ptr() != out.data_ptr() or not rows.is_contiguous():
        rows = scratch("linearize.hybrid.query_features", rows.shape, queries.device).copy_(rows)
    return rows.reshape(-1, block, rows.shape[-1])


def _outside_exact(keys, start, stop):
    """``[S − S_E, z − z_E]`` ``[rows·(blocks + 2), D, d + 1]`` for every halo query block (the padding blocks
    get zeros): the global sums less the exact set's (the window's three block sums and the sinks exact for
    the block: every query of a block has one exact set), the normaliser's as the last column (one product
    gives both: a matrix-vector ``bmm`` of many small blocks costs as much as the numerator's)."""
    rows, first, block = keys.rows, start // keys.block, keys.block
    count = -(-(stop - start) // block)
    dim_f, width = keys.state.shape[1:]
    both = scratch("linearize.hybrid.outside", (rows, count + 2, dim_f, width), keys.state.device)
    middle = both[:, 1:count + 1]
    torch.sub(keys.state[:, None], keys.blocks[:, first:first + count], out=middle)
    middle.sub_(keys.blocks[:, first + 1:first + count + 1]).sub_(keys.blocks[:, first + 2:first + count + 2])
    if keys.sinks:  # less φ(k_s)[v_s, 1]ᵀ of each sink exact for the block (a rank-one term: no product with k = 1)
        exact = _exact_sinks(keys, start, stop)[:, 1:count + 1].repeat(keys.heads, 1, 1).float()  # [rows, blocks, S]
        ones = torch.ones_like(keys.sink_values[..., :1])
        terms = keys.sink_features[..., :, None] * torch.cat([keys.sink_values, ones], dim=-1)[..., None, :]
        for sink in range(exact.shape[-1]):
            middle.addcmul_(exact[:, :, sink, None, None], terms[:, None, sink], value=-1.0)
    both[:, 0].zero_()
    both[:, count + 1].zero_()
    return both.view(-1, dim_f, width)
