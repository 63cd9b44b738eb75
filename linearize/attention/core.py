"""Non-causal kernel (linear) attention and its quadratic reference.

Every method shares one formula (Katharopoulos et al. 2020, "Transformers are RNNs", eq. 4-6;
LUNA eq. 9; docs/methods.md, "Linear attention"):

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
- Speed (inference): when no gradient is needed and the map is ``chunkable``, long sequences
  are processed in chunks of tokens (the same sums; the running key max above is kept online),
  so no full-length feature tensor is ever allocated: extra memory is the output plus
  O(chunk·D + D·d), and the temporaries stay in cache. Training (autograd) uses the one-shot
  form. Every fast path is tested against :func:`quadratic_attention`.
- Tracing (``torch.compile``, ``torch.export``, the ONNX exporters; :func:`is_tracing`): the
  one-shot form only, so the graph has no loop or branch sized by the input and stays valid at
  every batch size and length.
"""

from __future__ import annotations

import torch

DEFAULT_EPS = 1e-6


def is_tracing():
    """True while ``torch.compile``, ``torch.export`` or an ONNX exporter traces the forward.

    The eager fast paths (chunking, LUNA's knot lookup, skipping an all-real mask) branch on
    input sizes or tensor values; a traced graph must not, so it takes the plain form instead
    (the same formula: the fast paths are tested against it)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def _key_mask(key_padding_mask, batch, seq, device):
    """``[batch, seq]`` float32 mask of real keys (all ones when no mask is given)."""
    if key_padding_mask is None:
        return torch.ones(batch, seq, device=device, dtype=torch.float32)
    if key_padding_mask.shape != (batch, seq):
        raise ValueError(
            f"key_padding_mask must have shape [batch, seq] = {(batch, seq)}, got {tuple(key_padding_mask.shape)}"
        )
    return key_padding_mask.to(device=device, dtype=torch.float32)


def cast_finite(out, dtype):
    """Cast the float32 result to the model's dtype without overflowing to ±inf (fp16's range is
    65504: a nearly cancelling Flexformer normaliser can give larger values)."""
    if out.dtype != dtype and dtype in (torch.float16, torch.bfloat16):
        limit = torch.finfo(dtype).max
        out = out.clamp(-limit, limit)
    return out.to(dtype)


def guard_denominator(den, eps, feature_map=None):
    """Keep a normaliser away from zero: |den| < eps becomes ±eps (0 → +eps).

    A map with non-negative features (``feature_map.nonnegative``) gives ``den = φ(q)·Σφ(k) + ε
    >= ε`` already (a float sum of non-negative terms is non-negative), so it is returned as is.
    """
    if getattr(feature_map, "nonnegative", False):
        return den
    sign = torch.where(den < 0, -1.0, 1.0).to(den.dtype)
    return sign * den.abs().clamp_min(eps)


def feature_maps(q, k, feature_map, key_padding_mask=None, scale=None):
    """φ(Q) and φ(K) in float32, stabilised and with padded keys zeroed.

    Returns ``(phi_q [B,H,Nq,D], phi_k [B,H,Nk,D], key_mask [B,Nk])``. Each map is evaluated
    once per tensor; without a padding mask no masking op touches the features.
    """
    head_dim = q.shape[-1]
    scale = head_dim**-0.5 if scale is None else float(scale)
    root = scale**0.5
    batch, _, seq_k, _ = k.shape
    padded = key_padding_mask is not None
    mask = _key_mask(key_padding_mask, batch, seq_k, k.device)
    query_mask = mask if q.shape[2] == seq_k else None
    phi_q, _ = feature_map(q.float() * root, mask=query_mask)  # per-query log-scale cancels
    phi_k, log_k = feature_map(k.float() * root, mask=mask)
    key_mask = mask[:, None, :, None]  # [B,1,Nk,1]
    if log_k is not None:
        # Subtract the max over real keys of each (sequence, head): a constant that cancels.
        masked = log_k.masked_fill(key_mask == 0, float("-inf")) if padded else log_k
        shift = masked.amax(dim=(2, 3), keepdim=True).detach()
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        factor = (log_k - shift).clamp_max(0.0)
        if padded:
            factor = factor.masked_fill(key_mask == 0, 0.0)
        factor = torch.exp(factor)  # [B,H,Nk,1]: one multiply of the features below
        factor = factor * key_mask if padded else factor
        # in place (no new full-size tensor) unless autograd needs the map's output
        phi_k = phi_k * factor if torch.is_grad_enabled() and phi_k.requires_grad else phi_k.mul_(factor)
    elif padded:
        phi_k = phi_k * key_mask
    return phi_q, phi_k, mask


def linear_attention(q, k, v, feature_map, key_padding_mask=None, scale=None, eps=DEFAULT_EPS, chunk_size=None):
    """Linear attention ``φ(Q)(φ(K)ᵀV) / (φ(Q)φ(K)ᵀ1 + ε)`` without an N×N matrix.

    Katharopoulos et al. 2020, eq. 5-6, with the guarded normaliser described in the module
    docstring. Returns a tensor shaped and typed like ``v`` (but with ``q``'s sequence length).

    Two batched matrix products do the work: the state ``Σ φ(k_j) v_jᵀ = φ(K)ᵀV`` and the
    numerator ``φ(Q)·state`` (the ε term as the added bias of one ``baddbmm``); the normaliser
    is ``φ(Q)·Σ φ(k_j)``, a multiply-and-sum (see :func:`_normalised_output`).

    Inference (no gradient needed) with a chunkable map (``feature_map.chunkable``) runs over
    the sequence in chunks of ``chunk_size`` tokens (default: about ``CHUNK_ELEMENTS`` feature
    values per chunk): the same sums, but features and temporaries stay small and cache-resident,
    so the extra memory is O(chunk·D + D·d) besides the output (see :func:`_chunked_attention`).
    """
    if getattr(feature_map, "chunkable", False) and not is_tracing() and not _grad_needed(feature_map, q, k, v):
        batch, heads = k.shape[:2]
        chunk = _chunk_tokens(batch * heads, getattr(feature_map, "feature_dim", k.shape[-1]), chunk_size)
        if max(q.shape[2], k.shape[2]) > chunk and k.shape[2] > 0:
            return _chunked_attention(q, k, v, feature_map, key_padding_mask, scale, eps, chunk)
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    batch, heads, seq_q, dim_f = phi_q.shape
    rows, dim_v = batch * heads, v.shape[-1]
    vf = v.float().reshape(rows, -1, dim_v)
    keys = phi_k.reshape(rows, -1, dim_f)
    state = torch.bmm(keys.transpose(1, 2), vf)  # [B*H, D, d]: Σ φ(k_j) v_jᵀ
    key_sum = keys.sum(dim=1, keepdim=True)  # [B*H, 1, D]: Σ φ(k_j)
    real_v, n_real = _real_value_sums(v, mask, key_padding_mask is not None)
    out = _normalised_output(phi_q.reshape(rows, seq_q, dim_f), state, key_sum, real_v, n_real, eps, feature_map)
    return cast_finite(out.view(batch, heads, seq_q, dim_v), v.dtype)


def _real_value_sums(v, mask, padded):
    """``(Σ_j v_j [B*H, 1, d], n [B*H, 1, 1])`` over the real keys (all keys without padding)."""
    heads, dim_v = v.shape[1], v.shape[-1]
    vf = v.float()
    real_v = mask[:, None, None, :] @ vf if padded else vf.sum(dim=2, keepdim=True)
    n_real = mask.sum(dim=1).repeat_interleave(heads)  # the mask is all ones without padding
    return real_v.reshape(-1, 1, dim_v), n_real.reshape(-1, 1, 1)


def _normalised_output(phi_q, state, key_sum, real_v, n_real, eps, feature_map):
    """``(φ(q)·state + ε/n·Σv) / (φ(q)·Σφ(k) + ε)`` for ``phi_q [R, Nq, D]``, ``state [R, D, d]``,
    ``key_sum [R, 1, D]``, ``real_v [R, 1, d]``, ``n_real [R, 1, 1]`` (the guarded normaliser of the
    module docstring). Numerator and normaliser are separate products: a ``[D, d+1]`` state (the
    normaliser as an extra column) costs ~40% more in the CPU's GEMM kernels than ``[D, d]``, and
    a batched matrix-vector product more than a multiply-and-sum."""
    n_real = n_real.clamp_min(1.0)
    num = torch.baddbmm(real_v * (eps / n_real), phi_q, state)  # [R, Nq, d]
    den = (phi_q * key_sum).sum(dim=-1, keepdim=True).add_(eps)  # [R, Nq, 1]
    return num.div_(guard_denominator(den, eps, feature_map))


#: feature values (batch·heads·tokens·D) per chunk of the chunked inference path (2 MiB fp32):
#: 512 tokens of MiniLM-geometry LUNA (12 heads × 64 features); measured best at 512-1024 tokens
CHUNK_ELEMENTS = 2**19


def _grad_needed(feature_map, *tensors):
    """True if autograd could want a gradient from this call (then no chunking: training keeps the
    one-shot graph)."""
    if not torch.is_grad_enabled():
        return False
    return any(t.requires_grad for t in tensors) or any(p.requires_grad for p in feature_map.parameters())


def _chunk_tokens(rows, feature_dim, chunk_size):
    if chunk_size is not None:
        return max(1, int(chunk_size))
    tokens = CHUNK_ELEMENTS // max(1, rows * int(feature_dim))
    return max(64, 1 << max(tokens, 1).bit_length() - 1)  # a power of two, at least 64


def _chunked_attention(q, k, v, feature_map, key_padding_mask, scale, eps, chunk):
    """:func:`linear_attention` over chunks of ``chunk`` tokens, for chunkable maps without
    autograd (features by ``feature_map.chunk_features``): keys chunk by chunk into the state
    ``Σ φ(k_j)[v_j, 1]`` (:func:`_chunked_key_state`), then queries chunk by chunk against it,
    written into the output."""
    head_dim = q.shape[-1]
    scale = head_dim**-0.5 if scale is None else float(scale)
    root = scale**0.5
    batch, heads, seq_k, _ = k.shape
    seq_q, dim_v = q.shape[2], v.shape[-1]
    rows = batch * heads
    padded = key_padding_mask is not None
    mask = _key_mask(key_padding_mask, batch, seq_k, k.device)
    state, key_sum = _chunked_key_state(k, v, feature_map, mask, padded, root, chunk)
    real_v, n_real = _real_value_sums(v, mask, padded)
    out = torch.empty(batch, heads, seq_q, dim_v, dtype=v.dtype, device=v.device)
    # the queries' own mask: the keys' one for self-attention, else all real (as a None mask is)
    query_mask = mask if seq_q == seq_k else torch.ones(batch, seq_q, device=q.device)
    for start in range(0, seq_q, chunk):
        stop = min(start + chunk, seq_q)
        phi, _ = feature_map.chunk_features(q[:, :, start:stop].float() * root, query_mask, start)
        part = _normalised_output(phi.reshape(rows, stop - start, -1), state, key_sum, real_v, n_real, eps,
                                  feature_map)
        out[:, :, start:stop] = cast_finite(part.view(batch, heads, stop - start, dim_v), v.dtype)
    return out


def _chunked_key_state(k, v, feature_map, mask, padded, root, chunk):
    """``(state, key_sum)``: ``Σ_j φ(k_j) v_jᵀ`` ``[B*H, D, d]`` and ``Σ_j φ(k_j)`` ``[B*H, 1, D]``
    accumulated chunk by chunk (every temporary chunk-sized: no full-length copy); padded keys
    contribute nothing.

    Log-scaled maps: the max over real keys (the shift of :func:`feature_maps`) is kept as a
    running max; when a chunk raises it, the sums so far are multiplied by
    ``exp(old max − new max)`` (:func:`_log_scaled_chunk`), so every key ends up scaled by
    ``exp(s_j − max_j s_j)`` exactly as in the one-shot path.
    """
    batch, heads, seq_k, _ = k.shape
    rows, dim_v = batch * heads, v.shape[-1]
    state = key_sum = top = None  # top: the running max of the keys' log-scales [B, H, 1, 1]
    for start in range(0, seq_k, chunk):
        stop = min(start + chunk, seq_k)
        keep = mask[:, None, start:stop, None]
        phi, log = feature_map.chunk_features(k[:, :, start:stop].float() * root, mask, start)
        if log is not None:
            phi, top, rescale = _log_scaled_chunk(phi, log, keep, top, padded)
            if rescale is not None:  # not the first chunk: the sums so far exist
                state.mul_(rescale.reshape(rows, 1, 1))
                key_sum.mul_(rescale.reshape(rows, 1, 1))
        elif padded:
            phi = phi.mul_(keep)
        values = v[:, :, start:stop].float().reshape(rows, stop - start, dim_v)
        phi = phi.reshape(rows, stop - start, -1)
        if state is None:
            state, key_sum = torch.bmm(phi.transpose(1, 2), values), phi.sum(dim=1, keepdim=True)
        else:
            state.baddbmm_(phi.transpose(1, 2), values)
            key_sum += phi.sum(dim=1, keepdim=True)
    return state, key_sum


def _log_scaled_chunk(phi, log, keep, top, padded):
    """``(phi · exp(log − max), new running max, rescale)`` for one chunk of keys of a log-scaled
    map: ``max`` is the running max ``top`` over the real keys so far, this chunk included (``-inf``
    while no real key was seen; then no shift); ``rescale`` ``exp(old − new max)`` ``[B, H, 1, 1]``
    is what the sums of the earlier chunks must be multiplied by (``None`` for the first chunk).
    ``phi`` is scaled in place (no autograd on this path); padded keys (``keep`` 0) become 0."""
    masked = log.masked_fill(keep == 0, float("-inf")) if padded else log
    chunk_top = masked.amax(dim=(2, 3), keepdim=True)
    rescale = None
    if top is None:
        top = chunk_top
    else:
        new_top = torch.maximum(top, chunk_top)
        rescale = torch.where(torch.isfinite(top), torch.exp(top - new_top), torch.zeros_like(top))
        top = new_top
    shift = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    factor = (log - shift).clamp_max(0.0)
    if padded:
        factor = factor.masked_fill(keep == 0, 0.0)
    factor = torch.exp(factor)
    return phi.mul_(factor * keep if padded else factor), top, rescale


def kernel_matrix(q, k, feature_map, key_padding_mask=None, scale=None):
    """Unnormalised kernel values κ_ij = φ(q_i)ᵀφ(k_j) ``[B,H,Nq,Nk]`` (float32, pads 0)."""
    phi_q, phi_k, _ = feature_maps(q, k, feature_map, key_padding_mask, scale)
    return phi_q @ phi_k.transpose(-1, -2)


def linear_attention_weights(q, k, feature_map, key_padding_mask=None, scale=None, eps=DEFAULT_EPS):
    """The quadratic form Â (float32, ``[B,H,Nq,Nk]``) of the same kernel and normaliser as
    :func:`linear_attention`: rows sum to one over real keys and are zero on padded keys."""
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    return normalised_kernel_rows(phi_q, phi_k, mask, eps)


def normalised_kernel_rows(phi_q, phi_k, mask, eps=DEFAULT_EPS):
    """Â rows ``[B,H,Nq,Nk]`` from features (the outputs of :func:`feature_maps`) with the guarded
    normaliser of the module docstring; ``phi_q`` may hold any subset of the query rows (stage 1's
    blockwise loss passes one block of them), since each row only needs its own features and every
    key's."""
    kappa = phi_q @ phi_k.transpose(-1, -2)
    n_real = mask.sum(dim=1).clamp_min(1.0)[:, None, None, None]
    kappa = kappa + (eps / n_real) * mask[:, None, None, :]
    den = kappa.sum(dim=-1, keepdim=True)
    return kappa / guard_denominator(den, eps)


def quadratic_attention(q, k, v, feature_map, key_padding_mask=None, scale=None, eps=DEFAULT_EPS):
    """Naive O(N²) reference: ``Â V``. Every fast path is tested against it."""
    weights = linear_attention_weights(q, k, feature_map, key_padding_mask, scale, eps)
    return cast_finite(weights @ v.float(), v.dtype)


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
