"""Hybrid attention: exact softmax over a window of nearby keys and a few sink tokens, linear
attention over every other key, in one normalisation.

LoLCATs (Zhang et al. 2024, "LoLCATs: On Low-Rank Linearizing of Large Language Models", §3.2,
"sliding window + linear attention") and Based (Arora et al. 2024, "Simple linear attention language
models balance the recall-throughput tradeoff", §3) keep exact softmax for the nearby keys, which a
feature map approximates worst (sharp, local attention), and use linear attention for the rest.
For a bidirectional encoder the window is BigBird's blocked sliding window (Zaheer et al. 2020,
"Big Bird: Transformers for Longer Sequences", §2 and App. D, "blockified" attention: each block of
queries attends to its own key block and the two neighbouring ones): with blocks of ``R`` tokens,
``β(i) = ⌊i / R⌋``, the exact set of query ``i`` is

    E_i = ({j : |β(i) − β(j)| ≤ 1} ∪ S) ∩ {real keys}      (R = 0: no window, E_i = S ∩ {real keys}),

which holds every key within ``R`` positions of ``i`` and up to ``2R − 1`` on one side; ``S`` is a
handful of "attention sink" positions per sequence (Xiao et al. 2023, "Efficient Streaming Language
Models with Attention Sinks", §3; BigBird's global tokens: in BERT-style encoders [CLS] and [SEP]).
LoLCATs' eq. (sliding window + linear attention) then reads

    y_i = ( Σ_{j∈E_i} exp(s_ij − c_i) v_j  +  γ_h Σ_{j∉E_i} κ_ij v_j )
          / ( Σ_{j∈E_i} exp(s_ij − c_i)    +  γ_h Σ_{j∉E_i} κ_ij ),

with ``s_ij = q_iᵀk_j·scale`` the softmax scores, ``c_i = max_{j∈E_i} s_ij`` (so the exact weights
are at most 1, as in LoLCATs' code: the linear term is not rescaled by it), ``κ_ij = φ(q_i)ᵀφ(k_j)``
the feature map's kernel (``core.feature_maps``: padded keys zeroed, a log-scaled map's keys shifted
by one per-sequence constant and its queries' log-scale dropped, each query's largest feature 1: for
Performer and DARKFormer ``κ`` is the paper's kernel times a per-query and a per-sequence factor, which
the learned ``γ_h`` and training work with) and ``γ_h > 0`` a learned factor per head. The guard of ``core`` is
kept: ``ε/n`` is added to every real key's weight and ``ε`` to the normaliser (``n`` real keys), so a
row with no exact key and all-zero features is uniform, never 0/0.

Why blocks and not the band ``|i − j| ≤ R``: the linear sum over the keys outside the window is the
whole sequence's state minus the window's part, ``Σ_{j∉E_i} κ_ij v_j = φ(q_i)ᵀ(S − S_{E_i})``. With
a band, ``S_{E_i}`` differs from query to query, so the window's kernel values ``κ_ij`` must be formed
pair by pair (a ``D``-wide product per pair, besides the scores); with blocks, every query of a block
shares one window, whose sums come from running sums over the key blocks. For the same computed
scores (``3R`` per query) the blocks keep 50% more keys exact. Measured on a 2-core CPU (MiniLM
geometry, Hedgehog, N = 2,048 and 4,096, docs/experiments/hybrid): the band takes 1.15× the blocks'
time per layer at R = 32 and 1.4-1.8× at R = 64, 0.7-0.85× at R = 16; before training, the blocks'
attention KL at R = 32 (0.82) is lower than the band's (0.87).

:func:`hybrid_attention` computes it block by block: every query block's scores against its three key
blocks and the sinks outside them (all blocks in one batched product, in groups of blocks that bound
the temporaries) and its linear part from its block state: O(N·(3R + D)·d), never an N×N tensor.
Inference (no gradient wanted) with a chunkable map runs the same sums chunk by chunk in reused buffers
(``hybrid_chunked``: what a user's forward takes), as ``core``'s linear attention does.
:func:`hybrid_attention_weights` is the naive N×N reference both are tested against (and the rows
``output_attentions`` returns and stage 1 distils). Where every window covers the whole sequence
(``N ≤ 2R``) the layer is exact softmax and runs as such (SDPA).

Like ``core``, this module only imports torch, so a saved model's remote code bundles it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .core import (DEFAULT_EPS, cast_finite, feature_maps, grad_needed, guard_denominator, is_tracing,
                   softmax_attention)
from .hybrid_chunked import chunked_hybrid_attention

#: the sink positions a hybrid layer can keep exact: each sequence's first and last real token
SINK_NAMES = ("first", "last")

#: query rows per group of blocks of :func:`hybrid_attention` in eager mode (bounds the temporaries)
GROUP_ROWS = 1024


def parse_sinks(sinks):
    """The sink names of ``sinks`` (``"none"``, ``"first"``, ``"last"``, ``"first,last"`` or ``"first+last"``,
    or a list of names) as a tuple in :data:`SINK_NAMES` order; ``ValueError`` (one line) for another name."""
    if sinks is None:
        return ()
    if isinstance(sinks, str):
        names = [part.strip() for part in sinks.replace("+", ",").split(",")]
    else:
        names = [str(name) for name in sinks]
    names = [name for name in names if name and name != "none"]
    unknown = sorted(set(names) - set(SINK_NAMES))
    if unknown:
        raise ValueError(f"unknown sink {unknown[0]!r}; sinks are none, or a comma-separated list of "
                         f"{', '.join(SINK_NAMES)} (each sequence's first / last real token)")
    return tuple(name for name in SINK_NAMES if name in names)


def describe(method, window=0, sinks=(), hybrid_layers=None):
    """One line on how a converted layer attends, for summaries, reports and model cards (``hybrid_layers``: the
    hybrid ones, None for every converted layer)."""
    sinks = parse_sinks(sinks)
    if method == "softmax":  # the exact map (feature_maps.softmax): no kernel, no window
        return "exact softmax attention (the softmax method)"
    if not window and not sinks:
        return f"{method} linear attention"
    parts = [f"within its {window}-token block and the two neighbouring blocks"] if window else []
    if sinks:
        parts.append(f"on each sequence's {' and '.join(sinks)} real token" + ("s" if len(sinks) > 1 else ""))
    short = f"; inputs of at most {2 * window} tokens run exact softmax" if window else ""
    where = ""
    if hybrid_layers is not None:
        where = f" in layers {', '.join(str(index) for index in hybrid_layers)} (the other converted layers: {method} " \
                "linear attention)"
        short = f"; in those layers inputs of at most {2 * window} tokens run exact softmax" if window else ""
    return f"hybrid{where}: exact softmax {' and '.join(parts)}, {method} linear attention for the other keys{short}"


def sink_positions(key_padding_mask, batch, seq, sinks, device):
    """``(positions [B, S] long, valid [B, S] bool)`` of the sink tokens ``sinks`` of each sequence:
    ``first`` / ``last`` are its first / last real token (0 and N − 1 without padding). A sink is not
    valid in a sequence with no real token, or where it is the same token as an earlier sink."""
    if key_padding_mask is None and not is_tracing():  # eager, no padding: known without a look at the tokens
        positions = torch.tensor([0 if name == "first" else seq - 1 for name in sinks], device=device)
        valid = torch.ones(len(sinks), dtype=torch.bool, device=device)
        if len(sinks) == 2 and seq == 1:
            valid[1] = False
        return positions.expand(batch, -1), valid.expand(batch, -1)
    if key_padding_mask is None:
        mask = torch.ones(batch, seq, dtype=torch.bool, device=device)
    else:
        mask = key_padding_mask.to(device=device, dtype=torch.bool)
    index = torch.arange(seq, device=device).expand(batch, seq)
    found = {"first": torch.where(mask, index, seq).amin(dim=1).clamp_max(seq - 1),
             "last": torch.where(mask, index, -1).amax(dim=1).clamp_min(0)}
    positions = torch.stack([found[name] for name in sinks], dim=1)
    valid = mask.gather(1, positions)
    if len(sinks) == 2:  # a one-token sequence: its first token is its last
        valid = torch.stack([valid[:, 0], valid[:, 1] & (positions[:, 1] != positions[:, 0])], dim=1)
    return positions, valid


def exact_set(rows, seq_k, radius, sinks, key_mask):
    """``[B, 1, len(rows), N]`` bool: key ``j`` is in query ``i``'s exact set ``E_i`` (module docstring:
    blocks of ``radius`` tokens) for the query positions ``rows`` (a 1-D long tensor); ``key_mask [B, N]``
    the real keys; ``radius`` 0: no window (the sinks only)."""
    cols = torch.arange(seq_k, device=key_mask.device)
    block = max(1, int(radius))
    inside = ((rows[:, None] // block - cols[None, :] // block).abs() <= 1)[None] & (int(radius) > 0)  # [1, b, N]
    if sinks:
        positions, valid = sink_positions(key_mask, key_mask.shape[0], seq_k, sinks, key_mask.device)
        marked = (F.one_hot(positions, seq_k).bool() & valid[..., None]).any(dim=1)  # [B, N]
        inside = inside | marked[:, None, :]
    return (inside & key_mask.bool()[:, None, :])[:, None]


def hybrid_rows(scores, kappa, exact, gamma, key_mask, eps=DEFAULT_EPS):
    """Hybrid attention rows (module docstring) from ``scores [B,H,b,N]`` (``q·k·scale``), the kernel
    values ``kappa [B,H,b,N]`` (0 on padded keys), ``exact [B,1,b,N]`` (:func:`exact_set`), ``gamma [H]``
    and the real keys ``key_mask [B,N]`` (float): rows that sum to one over the real keys."""
    masked = scores.masked_fill(~exact, float("-inf"))
    soft = torch.exp(masked - _finite(masked.amax(dim=-1, keepdim=True)))  # 0 outside the exact set
    linear = (kappa * gamma.to(kappa.dtype)[None, :, None, None]).masked_fill(exact, 0.0)
    n_real = key_mask.sum(dim=1).clamp_min(1.0)[:, None, None, None]
    weights = soft + linear + (eps / n_real) * key_mask[:, None, None, :]
    return weights / guard_denominator(weights.sum(dim=-1, keepdim=True), eps)


def hybrid_block_rows(q, k, phi_q, phi_k, key_mask, start, radius, sinks, gamma, scale=None, eps=DEFAULT_EPS):
    """The hybrid rows ``[B,H,b,N]`` of the query rows ``start .. start + b`` (``q [B,H,b,d]`` and their
    features ``phi_q``) against every key (``k``, ``phi_k`` from ``core.feature_maps``, ``key_mask
    [B,N]``): what stage 1 distils, block by block (``linearize.distill.blockwise``). Equal to the rows of
    :func:`hybrid_attention_weights` (the reference: :func:`hybrid_rows` over :func:`exact_set`), but the
    scores, their exp and the exact-set mask are formed only where a row can have exact keys: the
    columns of the rows' key blocks (:func:`window_columns`) and the sinks; the kernel part spans every key."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    seq, radius = k.shape[2], int(radius)
    rows = torch.arange(start, start + q.shape[2], device=q.device)
    key_real = key_mask.bool()
    linear = (phi_q * gamma.to(phi_q.dtype)[None, :, None, None]) @ phi_k.transpose(-1, -2)  # γ_h κ_ij, γ on b×D
    lo, hi = window_columns(start, q.shape[2], seq, radius)
    parts = []  # (masked scores, exact mask) of the window's columns, then of the sinks
    if hi > lo:
        cols = torch.arange(lo, hi, device=q.device)
        inside = (rows[:, None] // radius - cols[None, :] // radius).abs() <= 1  # [b, W]
        exact = (inside[None] & key_real[:, None, lo:hi])[:, None]  # [B,1,b,W]
        parts.append((q.float() @ k[:, :, lo:hi].float().transpose(-1, -2) * scale, exact))
    if sinks:
        positions, valid = sink_positions(key_mask, k.shape[0], seq, sinks, q.device)  # [B,S]
        sink_k = k.gather(2, positions[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3]))
        in_window = ((rows[None, :, None] // max(radius, 1) - positions[:, None, :] // max(radius, 1)).abs() <= 1
                     ) & (radius > 0)  # [B,b,S]: already exact as part of the window
        parts.append((q.float() @ sink_k.float().transpose(-1, -2) * scale, (valid[:, None, :] & ~in_window)[:, None]))
    if parts:
        masked = [scores.masked_fill(~exact, float("-inf")) for scores, exact in parts]
        top = _finite(torch.cat([m.amax(dim=-1, keepdim=True) for m in masked], dim=-1).amax(dim=-1, keepdim=True))
        soft = [torch.exp(m - top) for m in masked]  # 0 outside the exact set
        if hi > lo:
            linear[..., lo:hi] = torch.where(parts[0][1], soft[0], linear[..., lo:hi])
        if sinks:
            index = positions[:, None, None, :].expand(-1, linear.shape[1], linear.shape[2], -1)
            exact = parts[-1][1]  # the sinks outside the window: their kernel term becomes the exact weight
            linear = linear.scatter_add(-1, index, torch.where(exact, soft[-1] - linear.gather(-1, index), 0.0))
    n_real = key_mask.sum(dim=1).clamp_min(1.0)[:, None, None, None]
    weights = linear + (eps / n_real) * key_mask[:, None, None, :]
    return weights / guard_denominator(weights.sum(dim=-1, keepdim=True), eps)


def window_columns(start, rows, seq, radius):
    """``(lo, hi)``: the key columns in the window of any of the query rows ``start .. start + rows``
    (their blocks of ``radius`` tokens and the neighbouring ones); ``(0, 0)`` without a window."""
    if radius <= 0:
        return 0, 0
    return max(0, (start // radius - 1) * radius), min(seq, ((start + rows - 1) // radius + 2) * radius)


def check_self_attention(q, k):
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"hybrid attention is self-attention: queries and keys must be of one length, got "
                         f"{q.shape[2]} and {k.shape[2]}")


def hybrid_attention_weights(q, k, feature_map, radius, sinks=(), gamma=None, key_padding_mask=None, scale=None,
                             eps=DEFAULT_EPS):
    """The hybrid attention matrix ``[B,H,N,N]`` (float32; naive O(N²), the reference of
    :func:`hybrid_attention`): rows sum to one over the real keys, zero on padded keys."""
    check_self_attention(q, k)
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    gamma = torch.ones(q.shape[1], device=q.device) if gamma is None else gamma
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    exact = exact_set(torch.arange(q.shape[2], device=q.device), k.shape[2], radius, parse_sinks(sinks), mask)
    return hybrid_rows(scores, phi_q @ phi_k.transpose(-1, -2), exact, gamma, mask, eps)


def hybrid_quadratic_attention(q, k, v, feature_map, radius, sinks=(), gamma=None, key_padding_mask=None,
                               scale=None, eps=DEFAULT_EPS):
    """Naive O(N²) reference: the hybrid rows times ``V``. Every fast path is tested against it."""
    weights = hybrid_attention_weights(q, k, feature_map, radius, sinks, gamma, key_padding_mask, scale, eps)
    return cast_finite(weights @ v.float(), v.dtype)


def hybrid_attention(q, k, v, feature_map, radius, sinks=(), gamma=None, key_padding_mask=None, scale=None,
                     eps=DEFAULT_EPS):
    """Hybrid attention (module docstring) in O(N·(3R + D)·d): returns a tensor shaped and typed like ``v``.

    Without autograd, a chunkable map takes ``hybrid_chunked.chunked_hybrid_attention`` (inference: chunks of
    whole blocks in reused buffers). Otherwise (training, a traced graph, a map that is not chunkable):
    features, block sums and the global sums are formed once (:func:`_block_sums`); then every group of
    query blocks takes its exact part from its window's keys and the sinks outside it, and its linear
    part from its block state (:func:`_group_output`). Equal to :func:`hybrid_quadratic_attention` up
    to float rounding."""
    check_self_attention(q, k)
    sinks, radius = parse_sinks(sinks), int(radius)
    batch, heads, seq, _ = q.shape
    if not is_tracing() and 0 < radius and seq <= 2 * radius:  # traced: one graph for every length
        return softmax_attention(q, k, v, key_padding_mask, scale)
    inputs = (q, k, v) if gamma is None else (q, k, v, gamma)
    chunked = getattr(feature_map, "chunkable", False) and not is_tracing() and not grad_needed(feature_map, *inputs)
    if radius and chunked:  # inference
        found = sink_positions(key_padding_mask, batch, seq, sinks, q.device) if sinks else None
        gamma = torch.ones(heads, device=q.device) if gamma is None else gamma.detach()
        return chunked_hybrid_attention(q, k, v, feature_map, radius, found, gamma, key_padding_mask, scale, eps)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    gamma = (torch.ones(heads, device=q.device) if gamma is None else gamma.float()).reshape(1, heads, 1, 1)
    if radius:  # whole blocks: padded tokens are keys of no query, and their rows are cut off the output
        q, k, v, key_padding_mask = _whole_blocks(q, k, v, key_padding_mask, radius)
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    vf = v.float()
    sink_keys = _sink_keys(k.float(), phi_k, vf, key_padding_mask, sinks) if sinks else None
    windows = _block_windows(*_block_sums(k.float(), phi_k, vf, mask, radius)) if radius else None
    n_real = mask.sum(dim=1).clamp_min(1.0)[:, None, None, None]
    real_v = (mask[:, None, :, None] * vf).sum(dim=2, keepdim=True) if key_padding_mask is not None \
        else vf.sum(dim=2, keepdim=True)
    state, key_sum = phi_k.transpose(-1, -2) @ vf, phi_k.sum(dim=2)[..., None]  # Σ φ(k_j) v_jᵀ, Σ φ(k_j)
    shared = (sink_keys, radius, gamma, state, key_sum, (eps / n_real) * real_v, eps)
    q = q.float() * scale
    if is_tracing():  # one group: no loop sized by the input in the graph
        return cast_finite(_group_output(0, q, phi_q, windows, *shared), v.dtype)[:, :, :seq]
    out = torch.empty(batch, heads, seq, v.shape[-1], dtype=v.dtype, device=v.device)
    group = max(1, GROUP_ROWS // max(1, radius)) * max(1, radius)
    # the groups as pieces of one split: its backward joins their gradients, where a slice per group would
    # fill a zero gradient of the whole tensor for every group
    pieces = zip(q.split(group, dim=2), phi_q.split(group, dim=2),
                 zip(*_split_block_windows(windows, group // radius)) if radius else [None] * math.ceil(seq / group))
    for start, (q_rows, phi_rows, window) in zip(range(0, seq, group), pieces):
        rows = _group_output(start, q_rows, phi_rows, window, *shared)
        out[:, :, start:start + group] = cast_finite(rows[:, :, :seq - start], v.dtype)
    return out


def _whole_blocks(q, k, v, key_padding_mask, block):
    """``q, k, v`` and the key mask padded to whole blocks of ``block`` tokens (the pads not real keys): every
    tensor of the blocked computation then splits into blocks without a remainder, and a traced graph holds
    for every length (no slice of a padded block is taken until the output). Eager inputs of whole blocks
    are returned as they are."""
    batch, _, seq, _ = q.shape
    extra = (seq + block - 1) // block * block - seq
    if not is_tracing() and extra == 0:
        return q, k, v, key_padding_mask
    mask = torch.ones(batch, seq, dtype=torch.bool, device=q.device) if key_padding_mask is None \
        else key_padding_mask.to(device=q.device, dtype=torch.bool)
    return (*(F.pad(x, (0, 0, 0, extra)) for x in (q, k, v)), F.pad(mask, (0, extra)))


def _block_sums(k, phi_k, v, mask, block):
    """The keys in blocks of ``block`` tokens, one block of zeros (not real) before the first and after
    the last, and the running sums over blocks: ``(keys, values [B,H,nb+2,block,d], real [B,nb+2,block],
    Σ_{blocks < β} φ(k_j) v_jᵀ [B,H,nb+3,D,d], Σ_{blocks < β} φ(k_j) [B,H,nb+3,D,1])``. Query block ``β``'s
    window is key blocks ``β .. β+2`` here, and its window's sums are the running sums at ``β + 3``
    less those at ``β``."""
    blocks = k.shape[2] // block + 2  # whole blocks (_whole_blocks), and one block of pads on either side
    keys, features, values = (F.pad(x, (0, 0, block, block)).unflatten(2, (blocks, block)) for x in (k, phi_k, v))
    real = F.pad(mask, (block, block)).unflatten(1, (blocks, block))
    states = F.pad(features.transpose(-1, -2) @ values, (0, 0, 0, 0, 1, 0)).cumsum(dim=2)
    sums = F.pad(features.sum(dim=3), (0, 0, 1, 0)).cumsum(dim=2)[..., None]
    return keys, values, real, states, sums


def _block_windows(keys, values, real, states, sums):
    """Every query block's window from :func:`_block_sums`: ``(keys [B,H,nb,3·block,d], values [B,H,nb,3·block,d],
    real [B,nb,3·block], Σ_{j∈window} φ(k_j) v_jᵀ [B,H,nb,D,d], Σ_{j∈window} φ(k_j) [B,H,nb,D,1])``, query block
    ``β``'s window the key blocks ``β .. β+2`` (with the padding blocks), its sums the running sums at ``β + 3``
    less those at ``β``."""
    count = keys.shape[2] - 2

    def three(x, dim):  # the three key blocks around every query block, as one axis
        return torch.cat([x.narrow(dim, shift, count) for shift in range(3)], dim=dim + 1)

    return (three(keys, 2), three(values, 2), three(real, 1), states.narrow(2, 3, count) - states.narrow(2, 0, count),
            sums.narrow(2, 3, count) - sums.narrow(2, 0, count))


def _split_block_windows(windows, blocks):
    """:func:`_block_windows` in pieces of ``blocks`` query blocks: one tuple of pieces per tensor."""
    keys, values, real, near_states, near_sums = windows
    return (*(x.split(blocks, dim=2) for x in (keys, values)), real.split(blocks, dim=1),
            *(x.split(blocks, dim=2) for x in (near_states, near_sums)))


def _sink_keys(k, phi_k, v, key_padding_mask, sinks):
    """``(keys [B,H,S,d], features [B,H,S,D], values [B,H,S,d], positions [B,S], valid [B,S])`` of the
    sink tokens of each sequence (:func:`sink_positions`)."""
    batch, heads, seq, _ = k.shape
    positions, valid = sink_positions(key_padding_mask, batch, seq, sinks, k.device)
    index = positions[:, None, :, None]

    def gather(x):
        return x.gather(2, index.expand(batch, heads, -1, x.shape[-1]))

    return gather(k), gather(phi_k), gather(v), positions, valid


def _group_output(start, q, phi_q, window, sink_keys, radius, gamma, state, key_sum, bias, eps):
    """The output rows ``start ..`` of ``q`` (times the scale) and ``phi_q``, that group's rows (float32;
    ``start`` a multiple of ``radius``; ``window``: its blocks' :func:`_block_windows`): the exact part (the
    window's, :func:`_window_part`, and the sinks', :func:`_sink_scores`) plus γ times the linear sums over
    the keys outside the exact set (the global sums less the window's and the exact sinks' terms), over
    the guarded normaliser."""
    linear_num, linear_den = phi_q @ state, phi_q @ key_sum
    sink = _sink_scores(q, sink_keys, start, radius) if sink_keys is not None else None
    top = sink[0].amax(dim=-1, keepdim=True) if sink is not None else None
    num, den = 0.0, 0.0
    if radius:
        num, den, top, near_num, near_den = _window_part(q, phi_q, window, radius, top)
        linear_num, linear_den = linear_num - near_num, linear_den - near_den
    if sink is not None:
        scores, exact = sink
        exp = _exp_minus(scores, top if radius else _finite(top))  # the window's c_i is finite already
        kappa = (phi_q @ sink_keys[1].transpose(-1, -2)).masked_fill(~exact, 0.0)  # the exact sinks' kernel
        num, den = num + exp @ sink_keys[2], den + exp.sum(dim=-1, keepdim=True)
        linear_num, linear_den = linear_num - kappa @ sink_keys[2], linear_den - kappa.sum(dim=-1, keepdim=True)
    num = num + gamma * linear_num + bias
    den = den + gamma * linear_den + eps
    return num / guard_denominator(den, eps)


def _by_block(x, block):
    """``x [B,H,n,·]`` (``n`` whole blocks: :func:`_whole_blocks`) as ``[B,H,n/block,block,·]``."""
    return x.unflatten(2, (x.shape[2] // block, block))


def _window_part(q, phi_q, window, block, sink_top):
    """The window's share of a group's rows (``q`` times the scale, ``phi_q`` their features, ``window``
    their blocks' :func:`_block_windows`): ``(Σ_{j∈window} exp(s_ij − c_i) v_j [B,H,n,d], its sum [B,H,n,1], c_i
    [B,H,n,1] (over the window and ``sink_top``, the sinks' max, or None), and the window's linear terms
    φ(q_i)ᵀΣ_{j∈window} φ(k_j)v_jᵀ [B,H,n,d] and φ(q_i)ᵀΣ_{j∈window} φ(k_j) [B,H,n,1])``."""
    qb, fb = _by_block(q, block), _by_block(phi_q, block)
    keys, values, real, near_states, near_sums = window
    scores = (qb @ keys.transpose(-1, -2)).masked_fill_(~real[:, None, :, None].bool(), float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)
    if sink_top is not None:
        top = torch.maximum(top, _by_block(sink_top, block))
    top = _finite(top)
    exp = _exp_minus(scores, top)
    num, den = (exp @ values).flatten(2, 3), exp.sum(dim=-1, keepdim=True).flatten(2, 3)
    near_num, near_den = ((fb @ x).flatten(2, 3) for x in (near_states, near_sums))
    return num, den, top.flatten(2, 3), near_num, near_den


def _sink_scores(q, sink_keys, start, block):
    """``(scores [B,H,n,S], exact [B,1,n,S])`` of the rows ``start ..`` against the sink keys, the scores
    ``-inf`` where a sink is not exact for a row: not a real, distinct token, or inside the row's window
    (``block`` 0: none)."""
    keys, _, _, positions, valid = sink_keys
    exact = valid[:, None, :]
    if block:
        here = torch.arange(start, start + q.shape[2], device=q.device) // block
        exact = exact & ((here[None, :, None] - (positions // block)[:, None, :]).abs() > 1)
    exact = exact[:, None]
    return (q @ keys.transpose(-1, -2)).masked_fill_(~exact, float("-inf")), exact


def _finite(top):
    """``c_i``: the max over a row's exact scores, 0 for a row without exact keys."""
    return torch.where(torch.isfinite(top), top, torch.zeros_like(top))


def _exp_minus(scores, top):
    """``exp(scores − top)`` (0 where a score is ``-inf``); in place on ``scores`` without autograd."""
    if torch.is_grad_enabled() and (scores.requires_grad or top.requires_grad):
        return torch.exp(scores - top)
    return scores.sub_(top).exp_()


def initial_log_gamma(num_heads, gamma):
    """The stored parameter of γ: ``log γ`` per head (γ = exp of it stays positive while it trains)."""
    return torch.full((int(num_heads),), math.log(float(gamma)))
