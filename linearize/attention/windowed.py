"""Sliding-window (local) attention: each query sees only the keys within ``radius`` positions.

Encoders such as ModernBERT alternate global layers with local ones (Warner et al. 2024, "Smarter,
Better, Faster, Longer: A Modern Bidirectional Encoder for Fast, Memory Efficient, and Long Context
Finetuning and Inference", §2.1.2 "Alternating Attention": a 128-token sliding window on two of every
three layers). The window is Longformer's (Beltagy, Peters & Cohan 2020, "Longformer: The
Long-Document Transformer", §3.1 "Sliding Window"): query ``i`` attends to the real keys
``W_i = {j : |i - j| ≤ r}``. Such a layer must stay local when it is converted, so a converted one
becomes *windowed* kernel attention: the kernel and guarded normaliser of ``core`` (Katharopoulos et
al. 2020, "Transformers are RNNs", eq. 4; LUNA eq. 9), summed over the window only,

    out_i = Σ_{j∈W_i} (κ_ij + ε/n_i) v_j / (Σ_{l∈W_i} κ_il + ε),   κ_ij = φ(q_i)ᵀφ(k_j),  n_i = |W_i|,

with the same features (``core.feature_maps``: padded keys zeroed, the keys' log-scale shifted by
one per-sequence constant). :func:`windowed_linear_attention` computes it block by block over the
queries, each block against the keys of its window only (O(N·(block + 2r)·D) time and memory, never
an N×N matrix); :func:`windowed_quadratic_attention` is the naive N×N reference it is tested against.
Exact softmax over the same window (a layer left softmax) is :func:`windowed_softmax_attention`.

Like ``core``, this module only imports torch, so a saved model's remote code bundles it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .core import DEFAULT_EPS, cast_finite, feature_maps, guard_denominator, is_tracing, softmax_attention_weights

#: query rows per block of :func:`windowed_linear_attention`
WINDOW_BLOCK = 256


def band_mask(seq_q, seq_k, radius, device=None):
    """``[Nq, Nk]`` bool: True where ``|i - j| ≤ radius`` (Longformer §3.1). Made in place in the one bool
    matrix: ``|i - j|`` as integers would pass 16 bytes per entry (4 GiB at 16,384 tokens, every local layer)."""
    radius = int(radius)
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).triu_(-radius).tril_(radius)


def _window_rows(phi_q, phi_k, key_mask, allowed, eps):
    """Â rows over a window: ``allowed [.., Nq, Nk]`` the band, ``key_mask [B, Nk]`` the real keys."""
    kappa = phi_q @ phi_k.transpose(-1, -2)
    keep = allowed & key_mask[:, None, None, :].bool()
    n_real = keep.sum(dim=-1, keepdim=True).clamp_min(1).float()
    kappa = torch.where(keep, kappa + eps / n_real, torch.zeros_like(kappa))
    return kappa / guard_denominator(kappa.sum(dim=-1, keepdim=True), eps)


def windowed_attention_weights(q, k, feature_map, radius, key_padding_mask=None, scale=None, eps=DEFAULT_EPS):
    """The windowed Â ``[B,H,N,N]`` (float32): rows sum to one over each query's real window keys and
    are zero elsewhere (the quadratic form of :func:`windowed_linear_attention`)."""
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    allowed = band_mask(q.shape[2], k.shape[2], radius, q.device)
    return _window_rows(phi_q, phi_k, mask, allowed, eps)


def windowed_quadratic_attention(q, k, v, feature_map, radius, key_padding_mask=None, scale=None, eps=DEFAULT_EPS):
    """Naive O(N²) reference of :func:`windowed_linear_attention`: windowed ``Â V``."""
    weights = windowed_attention_weights(q, k, feature_map, radius, key_padding_mask, scale, eps)
    return cast_finite(weights @ v.float(), v.dtype)


def windowed_linear_attention(q, k, v, feature_map, radius, key_padding_mask=None, scale=None, eps=DEFAULT_EPS,
                              block_size=WINDOW_BLOCK):
    """Windowed kernel attention (module docstring) over blocks of ``block_size`` query rows, each
    against the keys ``[start - r, stop + r)`` only: O(N·(block + 2r)) kernel values in all, equal to
    :func:`windowed_quadratic_attention`. Returns a tensor shaped and typed like ``v``.

    Traced (``core.is_tracing``): the quadratic form, whose graph has no loop sized by the input."""
    if is_tracing():
        return windowed_quadratic_attention(q, k, v, feature_map, radius, key_padding_mask, scale, eps)
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    seq_q, seq_k, radius = q.shape[2], k.shape[2], int(radius)
    out = torch.empty(*v.shape[:2], seq_q, v.shape[-1], dtype=v.dtype, device=v.device)
    vf = v.float()
    for start in range(0, seq_q, max(1, int(block_size))):
        stop = min(start + int(block_size), seq_q)
        low, high = max(0, start - radius), min(seq_k, stop + radius)
        rows = torch.arange(start, stop, device=q.device)[:, None]
        cols = torch.arange(low, high, device=q.device)[None, :]
        weights = _window_rows(phi_q[:, :, start:stop], phi_k[:, :, low:high], mask[:, low:high],
                               (rows - cols).abs() <= radius, eps)
        out[:, :, start:stop] = cast_finite(weights @ vf[:, :, low:high], v.dtype)
    return out


def windowed_softmax_attention(q, k, v, radius, key_padding_mask=None, scale=None, dropout=0.0,
                               output_attentions=False):
    """Exact softmax over each query's window of real keys (Vaswani et al. 2017, eq. 1, with Longformer's
    §3.1 window as the mask): ``(out [B,H,N,d], weights [B,H,N,N] or None)``. A query with no real key
    in its window gets zeros."""
    allowed = band_mask(q.shape[2], k.shape[2], radius, q.device)[None, None]
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask.to(device=q.device, dtype=torch.bool)[:, None, None, :]
    out = torch.nan_to_num(F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, dropout_p=dropout),
                           nan=0.0)
    weights = None
    if output_attentions:
        bias = torch.zeros(allowed.shape, device=q.device).masked_fill(~allowed, float("-inf"))
        weights = torch.nan_to_num(softmax_attention_weights(q, k, None, scale, attn_bias=bias), nan=0.0)
    return out, weights
