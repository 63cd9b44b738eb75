"""Non-causal kernel (linear) attention and its quadratic reference.

Every method shares one formula (Katharopoulos et al. 2020, eq. 4-6; ../shared/METHODS.md,
"Linear attention"):

    out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / (φ(q_i)ᵀ Σ_j φ(k_j) + ε)

computed right-to-left as ``φ(Q) (φ(K)ᵀ V)`` in O(N·D·d) time and O(D·d) state: the N×N
matrix is never formed. Its quadratic form

    Â_ij = φ(q_i)ᵀφ(k_j) / Σ_l φ(q_i)ᵀφ(k_l)

is the student's attention matrix (distillation, ``output_attentions``, plots).

Conventions (this module only imports torch, so it can be shipped inside a saved model's
remote code):

- ``q, k, v``: ``[batch, heads, seq, head_dim]``; ``key_padding_mask``: ``[batch, seq]``,
  True (or 1) for real tokens.
- Temperature: softmax scores ``q·k·scale`` (``scale = head_dim**-0.5`` by default); every
  feature map receives ``q·√scale`` and ``k·√scale`` (``q/d^¼``), so a map that estimates the
  exponential kernel estimates exactly the softmax kernel of the model.
- Padding: padded keys get ``φ(k) = 0``, so they leave both numerator and normaliser.
- Precision: features and sums are computed in float32 whatever the input dtype; the output
  is cast back.
- Stability: a map may return a per-token log-scale ``s`` with ``φ = exp(s)·features``
  (the exponential maps do). For queries ``s`` is dropped: a per-query factor cancels in the
  normalisation. For keys ``s - max_j s_j`` (max over real keys of each sequence and head) is
  used: a per-sequence constant cancels too. So no ``exp`` of an unbounded value is taken.
- Guarded normaliser: ε (default 1e-6) is added as ``ε/n`` to every real key's kernel value,
  n the number of real keys:

      Â_ij = (κ_ij + ε/n) / (Σ_l κ_il + ε)

  which is the formula above when κ ≫ ε, keeps every row a distribution that sums to one
  over real keys, and falls back to uniform attention when a query's features are all zero
  (LUNA's and ReLU's output ReLU can do that). Where kernel values can be negative
  (Flexformer's trigonometric features), a denominator with |·| < ε is replaced by ±ε
  (sign kept, 0 → +ε), so the weights stay finite; the fraction of negative kernel values is
  reported by :func:`kernel_statistics`.
"""

from __future__ import annotations

import torch

DEFAULT_EPS = 1e-6


def _key_mask(key_padding_mask, batch, seq, device):
    """``[batch, seq]`` float32 mask of real keys (all ones when no mask is given)."""
    if key_padding_mask is None:
        return torch.ones(batch, seq, device=device, dtype=torch.float32)
    if key_padding_mask.shape != (batch, seq):
        raise ValueError(
            f"key_padding_mask must have shape [batch, seq] = {(batch, seq)}, got {tuple(key_padding_mask.shape)}"
        )
    return key_padding_mask.to(device=device, dtype=torch.float32)


def _guard(den, eps):
    """Keep a normaliser away from zero: |den| < eps becomes ±eps (0 → +eps)."""
    sign = torch.where(den < 0, -1.0, 1.0).to(den.dtype)
    return sign * den.abs().clamp_min(eps)


def feature_maps(q, k, feature_map, key_padding_mask=None, scale=None):
    """φ(Q) and φ(K) in float32, stabilised and with padded keys zeroed.

    Returns ``(phi_q [B,H,Nq,D], phi_k [B,H,Nk,D], key_mask [B,Nk])``.
    """
    head_dim = q.shape[-1]
    scale = head_dim**-0.5 if scale is None else float(scale)
    root = scale**0.5
    batch, _, seq_k, _ = k.shape
    mask = _key_mask(key_padding_mask, batch, seq_k, k.device)
    query_mask = mask if q.shape[2] == seq_k else None
    phi_q, _ = feature_map(q.float() * root, mask=query_mask)  # per-query log-scale cancels
    phi_k, log_k = feature_map(k.float() * root, mask=mask)
    key_mask = mask[:, None, :, None]  # [B,1,Nk,1]
    if log_k is not None:
        # Subtract the max over real keys of each (sequence, head): a constant that cancels.
        masked = log_k.masked_fill(key_mask == 0, float("-inf"))
        shift = masked.amax(dim=(2, 3), keepdim=True).detach()
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        phi_k = phi_k * torch.exp((log_k - shift).clamp_max(0.0).masked_fill(key_mask == 0, 0.0))
    phi_k = phi_k * key_mask
    return phi_q, phi_k, mask


def linear_attention(q, k, v, feature_map, key_padding_mask=None, scale=None, eps=DEFAULT_EPS):
    """Linear attention ``φ(Q)(φ(K)ᵀV) / (φ(Q)φ(K)ᵀ1 + ε)`` without an N×N matrix.

    Katharopoulos et al. 2020, eq. 5-6, with the guarded normaliser described in the module
    docstring. Returns a tensor shaped and typed like ``v`` (but with ``q``'s sequence length).
    """
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    vf = v.float()
    kv = torch.einsum("bhnf,bhnd->bhfd", phi_k, vf)  # Σ_j φ(k_j) v_jᵀ  [B,H,D,d]
    z = phi_k.sum(dim=2)  # Σ_j φ(k_j)  [B,H,D]
    n_real = mask.sum(dim=1).clamp_min(1.0)[:, None, None, None]  # [B,1,1,1]
    v_sum = torch.einsum("bn,bhnd->bhd", mask, vf)[:, :, None, :]  # Σ_j v_j over real keys
    num = torch.einsum("bhnf,bhfd->bhnd", phi_q, kv) + (eps / n_real) * v_sum
    den = torch.einsum("bhnf,bhf->bhn", phi_q, z)[..., None] + eps
    return (num / _guard(den, eps)).to(v.dtype)


def kernel_matrix(q, k, feature_map, key_padding_mask=None, scale=None):
    """Unnormalised kernel values κ_ij = φ(q_i)ᵀφ(k_j) ``[B,H,Nq,Nk]`` (float32, pads 0)."""
    phi_q, phi_k, _ = feature_maps(q, k, feature_map, key_padding_mask, scale)
    return phi_q @ phi_k.transpose(-1, -2)


def linear_attention_weights(q, k, feature_map, key_padding_mask=None, scale=None, eps=DEFAULT_EPS):
    """The quadratic form Â (float32, ``[B,H,Nq,Nk]``) of the same kernel and normaliser as
    :func:`linear_attention`: rows sum to one over real keys and are zero on padded keys."""
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    kappa = phi_q @ phi_k.transpose(-1, -2)
    n_real = mask.sum(dim=1).clamp_min(1.0)[:, None, None, None]
    kappa = kappa + (eps / n_real) * mask[:, None, None, :]
    den = kappa.sum(dim=-1, keepdim=True)
    return kappa / _guard(den, eps)


def quadratic_attention(q, k, v, feature_map, key_padding_mask=None, scale=None, eps=DEFAULT_EPS):
    """Naive O(N²) reference: ``Â V``. Every fast path is tested against it."""
    weights = linear_attention_weights(q, k, feature_map, key_padding_mask, scale, eps)
    return (weights @ v.float()).to(v.dtype)


def softmax_attention_weights(q, k, key_padding_mask=None, scale=None, attn_bias=None):
    """Softmax attention rows ``softmax(q·kᵀ·scale + mask)`` in float32 (the teacher's A).

    Rows of a sequence with no real key are all zero (never NaN).
    """
    head_dim = q.shape[-1]
    scale = head_dim**-0.5 if scale is None else float(scale)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if attn_bias is not None:
        scores = scores + attn_bias.float()
    if key_padding_mask is not None:
        keep = key_padding_mask.to(torch.bool)[:, None, None, :]
        scores = scores.masked_fill(~keep, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return torch.nan_to_num(weights, nan=0.0)
    return torch.softmax(scores, dim=-1)


def kernel_statistics(q, k, feature_map, key_padding_mask=None, scale=None):
    """Diagnostics of a feature map on given inputs: the fraction of negative kernel values
    among real query/key pairs (non-zero only for Flexformer's trigonometric features) and the
    fraction of exactly-zero feature entries (LUNA's and ReLU's dead features)."""
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    kappa = phi_q @ phi_k.transpose(-1, -2)
    pair_mask = mask[:, None, None, :].expand_as(kappa)
    if q.shape[2] == k.shape[2]:
        pair_mask = pair_mask * mask[:, None, :, None]
    n_pairs = pair_mask.sum().clamp_min(1.0)
    negative = ((kappa < 0).float() * pair_mask).sum() / n_pairs
    zero = (phi_q == 0).float().mean()
    return {"negative_kernel_fraction": float(negative), "zero_feature_fraction": float(zero)}
