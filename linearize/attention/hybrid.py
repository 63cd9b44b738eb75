"""Hybrid attention: exact softmax over a sliding window and a few sink tokens, linear attention
over every other key, in one normalisation.

LoLCATs (Zhang et al. 2024, "LoLCATs: On Low-Rank Linearizing of Large Language Models", §3.2,
"sliding window + linear attention") and Based (Arora et al. 2024, "Simple linear attention language
models balance the recall-throughput tradeoff", §3) keep exact softmax for the nearby keys, which a
feature map approximates worst (sharp, local attention), and use linear attention for the rest.
For a bidirectional encoder, with the exact set of query ``i``

    E_i = ({j : |i − j| ≤ R} ∪ S) ∩ {real keys}      (R = 0: no window, E_i = S ∩ {real keys}),

``S`` a handful of "attention sink" positions per sequence (Xiao et al. 2023, "Efficient Streaming
Language Models with Attention Sinks", §3: a few tokens draw much of the attention; in BERT-style
encoders [CLS] and [SEP]), LoLCATs' eq. (sliding window + linear attention) reads

    y_i = ( Σ_{j∈E_i} exp(s_ij − c_i) v_j  +  γ_h Σ_{j∉E_i} κ_ij v_j )
          / ( Σ_{j∈E_i} exp(s_ij − c_i)    +  γ_h Σ_{j∉E_i} κ_ij ),

with ``s_ij = q_iᵀk_j·scale`` the softmax scores, ``c_i = max_{j∈E_i} s_ij`` (so the exact weights
are at most 1, as in LoLCATs' code: the linear term is not rescaled by it), ``κ_ij = φ(q_i)ᵀφ(k_j)``
the feature map's kernel (``core.feature_maps``: padded keys zeroed, a log-scaled map's keys shifted
by one per-sequence constant) and ``γ_h > 0`` a learned factor per head. The guard of ``core`` is
kept: ``ε/n`` is added to every real key's weight and ``ε`` to the normaliser (``n`` real keys), so a
row with no exact key and all-zero features is uniform, never 0/0.

Cost: the linear sum outside the window is the whole sequence's state minus the exact set's own
part, ``Σ_{j∉E_i} κ_ij v_j = φ(q_i)ᵀ(Σ_j φ(k_j) v_jᵀ) − Σ_{j∈E_i} κ_ij v_j``, so every query needs
the global state (O(N·D·d) in all) and its ``2R + 1 + |S|`` exact keys only. :func:`hybrid_attention`
computes the exact part over blocks of query rows against the keys of their window
(Longformer's sliding chunks: Beltagy et al. 2020, "Longformer", §3.1 and its banded implementation),
with no N×N tensor, all blocks in one batched product, in groups of blocks that bound the
temporaries; :func:`hybrid_attention_weights` is the naive N×N reference it is tested against (and
the rows ``output_attentions`` returns and stage 1 distils). Where every window covers the whole
sequence (``N ≤ R + 1``) the layer is exact softmax and runs as such (SDPA).

Like ``core``, this module only imports torch, so a saved model's remote code bundles it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .core import DEFAULT_EPS, cast_finite, feature_maps, guard_denominator, is_tracing

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


def describe(method, window=0, sinks=()):
    """One line on how a converted layer attends, for summaries, reports and model cards."""
    sinks = parse_sinks(sinks)
    if not window and not sinks:
        return f"{method} linear attention"
    parts = [f"within ±{window} tokens"] if window else []
    if sinks:
        parts.append(f"on each sequence's {' and '.join(sinks)} real token" + ("s" if len(sinks) > 1 else ""))
    short = f"; inputs of at most {window + 1} tokens run exact softmax" if window else ""
    return f"hybrid: exact softmax {' and '.join(parts)}, {method} linear attention for the other keys{short}"


def block_rows(radius):
    """Query rows per window block: ``R`` (at least 16), so a block reads the ``3·block`` keys of its own
    and its two neighbouring blocks for its ``2R + 1``-key windows."""
    return max(16, int(radius))


def sink_positions(key_padding_mask, batch, seq, sinks, device):
    """``(positions [B, S] long, valid [B, S] bool)`` of the sink tokens ``sinks`` of each sequence:
    ``first`` / ``last`` are its first / last real token (0 and N − 1 without padding). A sink is not
    valid in a sequence with no real token, or where it is the same token as an earlier sink."""
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
    """``[B, 1, len(rows), N]`` bool: key ``j`` is in query ``i``'s exact set ``E_i`` (module docstring)
    for the query positions ``rows`` (a 1-D long tensor); ``key_mask [B, N]`` the real keys; ``radius``
    0: no window (the sinks only)."""
    cols = torch.arange(seq_k, device=key_mask.device)
    inside = ((rows[:, None] - cols[None, :]).abs() <= int(radius))[None] & (int(radius) > 0)  # [1, b, N]
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
    top = masked.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # a row without exact keys
    soft = torch.exp(masked - top)  # 0 outside the exact set
    linear = (kappa * gamma.to(kappa.dtype)[None, :, None, None]).masked_fill(exact, 0.0)
    n_real = key_mask.sum(dim=1).clamp_min(1.0)[:, None, None, None]
    weights = soft + linear + (eps / n_real) * key_mask[:, None, None, :]
    return weights / guard_denominator(weights.sum(dim=-1, keepdim=True), eps)


def hybrid_block_rows(q, k, phi_q, phi_k, key_mask, start, radius, sinks, gamma, scale=None, eps=DEFAULT_EPS):
    """The hybrid rows ``[B,H,b,N]`` of the query rows ``start .. start + b`` (``q [B,H,b,d]`` and their
    features ``phi_q``) against every key (``k``, ``phi_k`` from ``core.feature_maps``, ``key_mask
    [B,N]``): what stage 1 distils, block by block (``linearize.distill.blockwise``)."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    kappa = phi_q @ phi_k.transpose(-1, -2)
    rows = torch.arange(start, start + q.shape[2], device=q.device)
    return hybrid_rows(scores, kappa, exact_set(rows, k.shape[2], radius, sinks, key_mask), gamma, key_mask, eps)


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
    return hybrid_block_rows(q, k, phi_q, phi_k, mask, 0, radius, parse_sinks(sinks), gamma, scale, eps)


def hybrid_quadratic_attention(q, k, v, feature_map, radius, sinks=(), gamma=None, key_padding_mask=None,
                               scale=None, eps=DEFAULT_EPS):
    """Naive O(N²) reference: the hybrid rows times ``V``. Every fast path is tested against it."""
    weights = hybrid_attention_weights(q, k, feature_map, radius, sinks, gamma, key_padding_mask, scale, eps)
    return cast_finite(weights @ v.float(), v.dtype)


def exact_softmax(q, k, v, key_padding_mask=None, scale=None, dropout=0.0):
    """Softmax attention over the real keys (SDPA; a sequence with no real key gets zeros): the hybrid
    layer where every window covers the whole sequence."""
    mask = None if key_padding_mask is None else key_padding_mask.to(device=q.device, dtype=torch.bool)[:, None, None]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, dropout_p=dropout)
    return out if mask is None else torch.nan_to_num(out, nan=0.0)


def hybrid_attention(q, k, v, feature_map, radius, sinks=(), gamma=None, key_padding_mask=None, scale=None,
                     eps=DEFAULT_EPS):
    """Hybrid attention (module docstring) in O(N·(R + D)·d): returns a tensor shaped and typed like ``v``.

    The global linear sums ``φ(Q)(φ(K)ᵀV)`` and ``φ(Q)(φ(K)ᵀ1)`` are formed once; the exact set's
    softmax weights and the kernel values to take out of those sums are formed over blocks of
    :func:`block_rows` query rows, each against its ``block + 2R`` window keys and the sink keys
    (:func:`_exact_part`). Equal to :func:`hybrid_quadratic_attention` up to float rounding."""
    check_self_attention(q, k)
    sinks = parse_sinks(sinks)
    batch, heads, seq, _ = q.shape
    if not is_tracing() and 0 < int(radius) and seq <= int(radius) + 1:  # traced: one graph for every length
        return exact_softmax(q, k, v, key_padding_mask, scale)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    gamma = torch.ones(heads, device=q.device) if gamma is None else gamma.float()
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    vf = v.float()
    state = phi_k.transpose(-1, -2) @ vf  # [B,H,D,d]: Σ φ(k_j) v_jᵀ
    key_sum = phi_k.sum(dim=2, keepdim=True).transpose(-1, -2)  # [B,H,D,1]: Σ φ(k_j)
    n_real = mask.sum(dim=1).clamp_min(1.0)[:, None, None, None]
    real_v = (mask[:, None, :, None] * vf).sum(dim=2, keepdim=True) if key_padding_mask is not None \
        else vf.sum(dim=2, keepdim=True)
    block = block_rows(radius)
    keys = _window_keys(k.float(), phi_k, vf, mask, block) if int(radius) > 0 else None
    sink_keys = _sink_keys(k.float(), phi_k, vf, key_padding_mask, sinks) if sinks else None
    g = gamma[None, :, None, None]
    parts = (q.float() * scale, phi_q, keys, sink_keys, radius, block, g, state, key_sum, (eps / n_real) * real_v, eps)
    if is_tracing():  # one group: no loop sized by the input in the graph
        return cast_finite(_group_output(0, *parts), v.dtype)
    out = torch.empty(batch, heads, seq, v.shape[-1], dtype=v.dtype, device=v.device)
    group = max(1, GROUP_ROWS // block) * block
    for start in range(0, seq, group):
        out[:, :, start:start + group] = cast_finite(_group_output(start, *parts, stop=start + group), v.dtype)
    return out


def _group_output(start, q, phi_q, keys, sink_keys, radius, block, gamma, state, key_sum, bias, eps, stop=None):
    """The output rows ``start .. stop`` (float32): the exact part (:func:`_exact_part`, or the sinks
    alone) plus γ times the global linear sums, over the guarded normaliser."""
    q, phi = q[:, :, start:stop], phi_q[:, :, start:stop]
    if int(radius) > 0 or sink_keys is not None:
        num, den = _exact_part(q, phi, keys, sink_keys, start, radius, block, gamma)
    else:  # no exact key at all: the linear part alone (γ cancels)
        num, den = 0.0, 0.0
    num = num + gamma * (phi @ state) + bias
    den = den + gamma * (phi @ key_sum) + eps
    return num / guard_denominator(den, eps)


def _window_keys(k, phi_k, v, mask, block):
    """Keys, features, values ``[B,H,nb+2,block,·]`` and the real-key mask ``[B,nb+2,block]`` in blocks
    of ``block`` tokens, one block of zeros (not real) before the first and after the last: the window
    of query block ``β`` lies within key blocks ``β .. β+2`` here (its neighbours and itself), which
    :func:`_exact_part` takes as three contiguous slices."""
    seq = k.shape[2]
    blocks = (seq + block - 1) // block + 2  # sizes spelt out, so a traced graph holds for every length
    pad = (block, blocks * block - seq - block)
    return tuple(F.pad(x, (0, 0, *pad)).unflatten(2, (blocks, block)) for x in (k, phi_k, v)) + (
        F.pad(mask, pad).unflatten(1, (blocks, block)),)


def _sink_keys(k, phi_k, v, key_padding_mask, sinks):
    """``(keys [B,H,S,d], features [B,H,S,D], values [B,H,S,d], positions [B,S], valid [B,S])`` of the
    sink tokens of each sequence (:func:`sink_positions`)."""
    batch, heads, seq, _ = k.shape
    positions, valid = sink_positions(key_padding_mask, batch, seq, sinks, k.device)
    index = positions[:, None, :, None]

    def gather(x):
        return x.gather(2, index.expand(batch, heads, -1, x.shape[-1]))

    return gather(k), gather(phi_k), gather(v), positions, valid


def _exact_part(q, phi_q, keys, sink_keys, start, radius, block, gamma):
    """``(numerator [B,H,n,d], normaliser [B,H,n,1])`` of the exact set of the query rows ``start ..
    start + n`` (``start`` a multiple of ``block``; ``q`` times the scale, and the rows' features
    ``phi_q``): ``Σ_{j∈E_i} (exp(s_ij − c_i) − γκ_ij)·(v_j, 1)``, i.e. the exact weights plus the kernel
    values to take out of the global linear sums. The rows go in blocks of ``block`` (≥ R), every block
    against the three key blocks around it (:func:`_window_keys`: its window lies within them, the band
    ``|i − j| ≤ R`` is masked); the sink keys not already in a row's window join it
    (:func:`_sink_scores`). Without a window (``radius`` 0) the sinks alone are exact."""
    radius, rows = int(radius), q.shape[2]
    sinks = _sink_scores(q, sink_keys, start, radius) if sink_keys is not None else None
    if radius == 0:
        top = _finite(sinks[0].amax(dim=-1, keepdim=True))
        return _sink_sums(phi_q, sink_keys, sinks, top, gamma)
    first, blocks = start // block, (rows + block - 1) // block  # no negative floor division: ONNX truncates it
    extra = blocks * block - rows
    qb, fb = (F.pad(x, (0, 0, 0, extra)).unflatten(2, (blocks, block)) for x in (q, phi_q))
    k, phi_k, v = (torch.cat([x[:, :, first + shift: first + shift + blocks] for shift in range(3)], dim=3)
                   for x in keys[:3])  # [B,H,nb,3·block,·]: contiguous
    mask = torch.cat([keys[3][:, first + shift: first + shift + blocks] for shift in range(3)], dim=2)
    offset = torch.arange(3 * block, device=q.device)[None, :] - block - torch.arange(block, device=q.device)[:, None]
    exact = ((offset.abs() <= radius)[None, None] & mask[:, :, None].bool())[:, None]  # [B,1,nb,b,3b]
    scores = (qb @ k.transpose(-1, -2)).masked_fill_(~exact, float("-inf"))  # [B,H,nb,b,3b]
    top = scores.amax(dim=-1, keepdim=True)
    if sinks is not None:
        sink_top = F.pad(sinks[0].amax(dim=-1, keepdim=True), (0, 0, 0, extra), value=float("-inf"))
        top = torch.maximum(top, sink_top.unflatten(2, (blocks, block)))
    top = _finite(top)
    weights = _exact_weights(scores, top, fb @ phi_k.transpose(-1, -2), exact, gamma)
    num = (weights @ v).flatten(2, 3)[:, :, :rows]
    den = weights.sum(dim=-1, keepdim=True).flatten(2, 3)[:, :, :rows]
    if sinks is None:
        return num, den
    sink_num, sink_den = _sink_sums(phi_q, sink_keys, sinks, top.flatten(2, 3)[:, :, :rows], gamma)
    return num + sink_num, den + sink_den


def _sink_scores(q, sink_keys, start, radius):
    """``(scores [B,H,n,S], exact [B,1,n,S])`` of the query rows ``start .. start + n`` against the sink
    keys: a sink is exact for a row where it is a real, distinct token outside the row's window."""
    keys, _, _, positions, valid = sink_keys
    exact = valid[:, None, :]
    if radius > 0:
        here = torch.arange(start, start + q.shape[2], device=q.device)
        exact = exact & ((here[None, :, None] - positions[:, None, :]).abs() > radius)
    exact = exact[:, None]
    return (q @ keys.transpose(-1, -2)).masked_fill_(~exact, float("-inf")), exact


def _sink_sums(phi_q, sink_keys, sinks, top, gamma):
    """The sinks' part ``(numerator, normaliser)`` of :func:`_exact_part`, ``top`` the rows' ``c_i``."""
    _, features, values, _, _ = sink_keys
    weights = _exact_weights(sinks[0], top, phi_q @ features.transpose(-1, -2), sinks[1], gamma)
    return weights @ values, weights.sum(dim=-1, keepdim=True)


def _finite(top):
    """``c_i``: the max over a row's exact scores, 0 for a row without exact keys."""
    return torch.where(torch.isfinite(top), top, torch.zeros_like(top))


def _exact_weights(scores, top, kappa, exact, gamma):
    """``exp(s_ij − c_i) − γκ_ij`` on the exact set, 0 elsewhere (``scores`` are ``-inf`` outside it),
    ``gamma`` ``[1,H,1,1]``. Without autograd it works in place on ``scores`` and ``kappa`` (no
    block-sized temporary beyond the two products)."""
    gamma = gamma.reshape(1, -1, *([1] * (scores.dim() - 2)))
    if torch.is_grad_enabled() and any(t.requires_grad for t in (scores, kappa, gamma)):
        return torch.exp(scores - top) - (kappa * gamma).masked_fill(~exact, 0.0)
    return scores.sub_(top).exp_().sub_(kappa.mul_(gamma).masked_fill_(~exact, 0.0))


def initial_log_gamma(num_heads, gamma):
    """The stored parameter of γ: ``log γ`` per head (γ = exp of it stays positive while it trains)."""
    return torch.full((int(num_heads),), math.log(float(gamma)))
