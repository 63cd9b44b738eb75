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
- Speed (inference): when no gradient is needed and the map is ``chunkable``, sequences of any
  length are processed in chunks of tokens (the same sums; the running key max above is kept
  online), so no full-length feature tensor is ever allocated, and every chunk-sized temporary
  is written into buffers kept per thread between calls (:func:`scratch`): a call allocates its
  output and a few small tensors, as SDPA does. Under glibc's default allocator (a user's own
  process) each new large block is otherwise mapped and faulted in afresh on every forward
  (docs/experiments/user-state). Training (autograd) uses the one-shot form. Every fast path
  is tested against :func:`quadratic_attention`.
- Tracing (``torch.compile``, ``torch.export``, the ONNX exporters; :func:`is_tracing`): the
  one-shot form only, so the graph has no loop or branch sized by the input and stays valid at
  every batch size and length.
"""

from __future__ import annotations

import math
import threading

import torch

DEFAULT_EPS = 1e-6

#: log₂(e): exp(a) = 2^(a·log₂ e), and ``exp2`` is 2-2.6× as fast as ``exp`` on a CPU (2 threads, 1-5 M values)
LOG2_E = 1.0 / math.log(2.0)


def is_tracing():
    """True while ``torch.compile``, ``torch.export`` or an ONNX exporter traces the forward.

    The eager fast paths (chunking, LUNA's knot lookup, skipping an all-real mask) branch on
    input sizes or tensor values; a traced graph must not, so it takes the plain form instead
    (the same formula: the fast paths are tested against it)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def check_attention_inputs(q, k, v=None, key_padding_mask=None, feature_map=None):
    """``ValueError`` (one line with the shapes) unless ``q``, ``k`` (and ``v``) are ``[batch, heads,
    seq, head_dim]`` tensors of one batch and head count, ``k`` and ``v`` of one length, ``q`` and
    ``k`` of one head dim (the ``feature_map``'s, when it has one) and ``key_padding_mask`` is
    ``[batch, key length]``. The public entry points call it first: a caller's mistake is said
    plainly, not as a shape error from inside a matrix product. About a microsecond when they fit."""
    try:  # the common case in one expression (it runs for every layer of every forward)
        qs, ks = q.shape, k.shape
        if (len(qs) == 4 and len(ks) == 4 and qs[:2] == ks[:2] and qs[3] == ks[3]
                and (v is None or (v.dim() == 4 and v.shape[:3] == (*qs[:2], ks[2])))
                and (key_padding_mask is None or key_padding_mask.shape == (ks[0], ks[2]))
                and getattr(feature_map, "head_dim", qs[3]) == qs[3]):
            return
    except (AttributeError, TypeError):  # not tensors: said below
        pass
    raise ValueError(_attention_input_problem(q, k, v, key_padding_mask, feature_map))


def _attention_input_problem(q, k, v, key_padding_mask, feature_map):
    """The message of :func:`check_attention_inputs` for inputs that do not fit."""
    named = (("q", q), ("k", k)) if v is None else (("q", q), ("k", k), ("v", v))
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            return f"attention input {name} must be a [batch, heads, seq, head_dim] tensor, got {shape}"
    if any(tensor.shape[:2] != q.shape[:2] for _, tensor in named):
        problem = "their batch sizes or head counts differ"
    elif v is not None and v.shape[2] != k.shape[2]:
        problem = "k and v differ in length"
    elif q.shape[3] != k.shape[3]:
        problem = "q and k differ in head dim"
    elif getattr(feature_map, "head_dim", q.shape[3]) != q.shape[3]:
        problem = f"the feature map was built for head_dim {feature_map.head_dim}"
    else:
        mask_shape = tuple(getattr(key_padding_mask, "shape", ())) or type(key_padding_mask).__name__
        problem = f"key_padding_mask {mask_shape} is not [batch, key length]"
    shapes = ", ".join(f"{name} {tuple(tensor.shape)}" for name, tensor in named)
    return (f"attention inputs do not fit: {problem} ({shapes}); expected [batch, heads, seq, head_dim] with one "
            "batch and head count, k and v of one length, q and k of one head dim")


def real_key_mask(key_padding_mask, batch, seq, device):
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
    mask = real_key_mask(key_padding_mask, batch, seq_k, k.device)
    query_mask = mask if q.shape[2] == seq_k else None
    phi_q, _ = feature_map(q.float() * root, mask=query_mask, **query_options(feature_map))  # log-scale cancels
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
    is ``φ(Q)·Σ φ(k_j)``, a batched matrix-vector product (see :func:`_normalised_output`).

    Inference (no gradient needed) with a chunkable map (``feature_map.chunkable``) runs over
    the sequence in chunks of ``chunk_size`` tokens (default: :func:`chunk_tokens`): the same sums, but
    features and temporaries stay small, in buffers reused from call to call (:func:`scratch`), so the
    extra memory is O(chunk·D + D·d)
    besides the output (see :func:`_chunked_attention`). A small call (batch × tokens at most
    :data:`ONE_SHOT_MAX_TOKENS`, no ``chunk_size`` given) takes the one-shot form instead: fewer operations.
    Inputs that do not fit together are a ``ValueError`` (:func:`check_attention_inputs`).
    """
    check_attention_inputs(q, k, v, key_padding_mask, feature_map)
    if getattr(feature_map, "chunkable", False) and not is_tracing() and not grad_needed(feature_map, q, k, v):
        batch, heads = k.shape[:2]
        small = chunk_size is None and batch * max(q.shape[2], k.shape[2]) <= ONE_SHOT_MAX_TOKENS
        if k.shape[2] > 0 and not small:  # this path's only new full-size tensor is the output
            chunk = chunk_tokens(batch * heads, getattr(feature_map, "feature_dim", k.shape[-1]), chunk_size, k.device)
            return _chunked_attention(q, k, v, feature_map, key_padding_mask, scale, eps, chunk)
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    batch, heads, seq_q, dim_f = phi_q.shape
    rows, dim_v = batch * heads, v.shape[-1]
    vf = v.float().reshape(rows, -1, dim_v)
    keys = phi_k.reshape(rows, -1, dim_f)
    state = torch.bmm(keys.transpose(1, 2), vf)  # [B*H, D, d]: Σ φ(k_j) v_jᵀ
    key_sum = keys.sum(dim=1, keepdim=True)  # [B*H, 1, D]: Σ φ(k_j)
    real_v, n_real = _real_value_sums(vf, mask, key_padding_mask is not None, heads)
    out = _normalised_output(phi_q.reshape(rows, seq_q, dim_f), state, key_sum, real_v, n_real, eps, feature_map)
    return cast_finite(out.view(batch, heads, seq_q, dim_v), v.dtype)


def _real_value_sums(values, mask, padded, heads):
    """``(Σ_j v_j [B*H, 1, d], n [B*H, 1, 1])`` over the real keys (all keys without padding), from
    the float32 value rows ``values [B*H, N, d]`` (the copy the state's product reads: no other)."""
    batch, seq = mask.shape
    if padded:  # a [1, N] by [N, d] product per row, not a masked copy of the values
        real_v = torch.matmul(mask[:, None, None, :], values.view(batch, heads, seq, -1))
    else:
        real_v = values.sum(dim=1, keepdim=True)
    n_real = mask.sum(dim=1).repeat_interleave(heads)  # the mask is all ones without padding
    return real_v.reshape(-1, 1, values.shape[-1]), n_real.reshape(-1, 1, 1)


def _normalised_output(phi_q, state, key_sum, real_v, n_real, eps, feature_map):
    """``(φ(q)·state + ε/n·Σv) / (φ(q)·Σφ(k) + ε)`` for ``phi_q [R, Nq, D]``, ``state [R, D, d]``,
    ``key_sum [R, 1, D]``, ``real_v [R, 1, d]``, ``n_real [R, 1, 1]`` (the guarded normaliser of the
    module docstring). Numerator and normaliser are separate products: a ``[D, d+1]`` state (the
    normaliser as an extra column) costs ~40% more in the CPU's GEMM kernels than ``[D, d]``. The
    normaliser is a matrix-vector ``bmm``: no ``[R, Nq, D]`` product as a multiply-and-sum makes,
    and faster, forward and backward (torch 2.14, 2-core CPU: 0.49 against 0.70 ms forward at
    R, Nq, D = 96, 512, 64)."""
    n_real = n_real.clamp_min(1.0)
    num = torch.baddbmm(real_v * (eps / n_real), phi_q, state)  # [R, Nq, d]
    den = torch.bmm(phi_q, key_sum.transpose(1, 2)).add_(eps)  # [R, Nq, 1]
    return num.div_(guard_denominator(den, eps, feature_map))


#: at most this many tokens in a call (batch × the longer of the query and key lengths), inference takes the
#: one-shot form rather than the chunked one: at these sizes the chunked path's ~40 extra small operations (its
#: buffers, views and running sums; ~0.2 ms a call on a 2-core CPU) cost more than the one-shot temporaries,
#: which are small. Measured per attention call at MiniLM's geometry for Hedgehog, T2R, DARKFormer and LUNA (M = 8
#: shared, M = 16 per head), batch 1-8 (docs/experiments/user-state/short-inputs.md): the one-shot form is
#: 0.04-0.30 ms faster at every shape up to 64 tokens, in two runs; at 128 it is faster for most but erratic for
#: LUNA M = 16 (2.5 against 1.7 ms in one run, 1.6 against 1.8 in the next)
ONE_SHOT_MAX_TOKENS = 64

#: feature values (batch·heads·tokens·D) per chunk of the chunked inference path (8 MiB fp32), and at most
#: ``CHUNK_ROWS`` (batch·heads·tokens) rows: measured best (docs/experiments/user-state, "Chunk size") for
#: Hedgehog, T2R, DARKFormer, LUNA (M = 8 shared and M = 16 per head) at MiniLM's geometry, batch 1 at
#: 1,024-8,192 tokens and batch 8 at 128-512; the earlier 2**19 chunks were 5-20% slower at every one of them
CHUNK_ELEMENTS = 2**21
CHUNK_ROWS = 2**15
#: the same on a GPU (64 MiB fp32): there a chunk's ~40 operations are kernel launches of ~10 µs each whatever
#: their size, and the CPU's chunks (2,048 tokens at MiniLM's 12 heads) made an H100's Hedgehog layer at 32,768
#: tokens 14 ms against SDPA's 6.7 (docs/experiments/bench/RESULTS.md#gpu)
GPU_CHUNK_ELEMENTS = 2**24


_SCRATCH = threading.local()


def scratch(name, shape, device, dtype=torch.float32):
    """A ``shape`` tensor (contents undefined) in this thread's buffer ``name``, kept between calls.

    The chunked inference path writes its chunk-sized temporaries (scaled inputs, features, values,
    partial products) into these instead of new tensors: in a user's process glibc's default
    allocator maps a large block afresh and faults it in page by page whenever one is allocated,
    and hands the top of its heap back to the system whenever enough of it is free
    (docs/experiments/user-state). A buffer grows to the largest size asked for (chunks hold about
    ``CHUNK_ELEMENTS`` values: about 20 MiB in all at MiniLM's geometry) and stays; :func:`release_scratch` frees them.
    Only for calls without autograd (the next call overwrites a buffer); per thread, so concurrent
    forwards never share one; buffers in use at the same time need distinct names.
    """
    buffers = _SCRATCH.__dict__.setdefault("buffers", {})
    key = (name, torch.device(device), dtype)
    numel = math.prod(shape)
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < numel:
        with torch.inference_mode(False):  # a normal tensor: writable in and out of inference mode
            buffer = buffers[key] = torch.empty(numel, dtype=dtype, device=device)
    return buffer[:numel].view(shape)


def release_scratch():
    """Free this thread's :func:`scratch` buffers."""
    _SCRATCH.__dict__.pop("buffers", None)


def grad_needed(feature_map, *tensors):
    """True if autograd could want a gradient from this call (then no chunking: training keeps the
    one-shot graph)."""
    if not torch.is_grad_enabled():
        return False
    return any(t.requires_grad for t in tensors) or any(p.requires_grad for p in feature_map.parameters())


def chunk_tokens(rows, feature_dim, chunk_size, device=None):
    """Tokens per chunk: ``chunk_size``, or the largest power of two (at least 64) whose chunk of ``rows``
    (batch·heads) sequences holds at most ``CHUNK_ELEMENTS`` features and ``CHUNK_ROWS`` token rows (on a
    GPU ``device``: ``GPU_CHUNK_ELEMENTS`` features, no row cap)."""
    if chunk_size is not None:
        return max(1, int(chunk_size))
    rows = max(1, rows)
    if device is not None and torch.device(device).type != "cpu":
        tokens = GPU_CHUNK_ELEMENTS // (rows * max(1, int(feature_dim)))
    else:
        tokens = min(CHUNK_ELEMENTS // (rows * max(1, int(feature_dim))), CHUNK_ROWS // rows)
    return max(64, 1 << max(tokens, 1).bit_length() - 1)  # a power of two, at least 64


def _chunked_attention(q, k, v, feature_map, key_padding_mask, scale, eps, chunk):
    """:func:`linear_attention` over chunks of ``chunk`` tokens, for chunkable maps without
    autograd (features by ``feature_map.chunk_features``): keys chunk by chunk into the state
    ``Σ φ(k_j) v_jᵀ`` and ``Σ φ(k_j)`` (:func:`_chunked_key_state`), then queries chunk by chunk
    against it (:func:`_write_chunk_output`).

    Memory: every chunk-sized temporary lives in :func:`scratch` buffers, stored head-major
    (``[H, B, c, ·]``: the rows ``h·B + b`` of one ``bmm`` with no copy), and the output is made
    in the ``[B, N, H, d]`` layout the caller's output projection reads and returned as a
    ``[B, H, N, d]`` view (transposing it back is free): the call's one new full-size tensor, as
    in SDPA."""
    head_dim = q.shape[-1]
    root = (head_dim**-0.5 if scale is None else float(scale)) ** 0.5
    batch, heads, seq_k, _ = k.shape
    seq_q = q.shape[2]
    padded = key_padding_mask is not None
    mask = real_key_mask(key_padding_mask, batch, seq_k, k.device)
    state, key_sum, real_v = _chunked_key_state(k, v, feature_map, mask, padded, root, chunk)
    bias = value_guard(real_v, mask, padded, heads, eps)
    out = torch.empty(batch, seq_q, heads, v.shape[-1], dtype=v.dtype, device=v.device)
    # the queries' own mask: the keys' one for self-attention, else all real (as a None mask is)
    query_mask = mask if seq_q == seq_k else torch.ones(batch, seq_q, device=q.device)
    for start in range(0, seq_q, chunk):
        stop = min(start + chunk, seq_q)
        phi, _ = features_of_chunk(feature_map, q, query_mask, start, stop, root, **query_options(feature_map))
        _write_chunk_output(phi, state, key_sum, bias, eps, feature_map, out[:, start:stop].permute(2, 0, 1, 3))
    return out.transpose(1, 2)


def query_options(feature_map):
    """What a query's features are asked with: ``log_scale=False`` for a map that :attr:`skips_log_scale`
    (``FeatureMap``): a query's log-scale is a per-row factor of its numerator and normaliser alike, dropped."""
    return {"log_scale": False} if getattr(feature_map, "skips_log_scale", False) else {}


def features_of_chunk(feature_map, x, mask, start, stop, root, **extra):
    """``(φ rows [H*B, c, D], log-scale [B, H, c, 1] or None)`` of the tokens ``start:stop`` of
    ``x [B, H, N, d]`` (times √scale), in :func:`scratch` buffers (head-major). A map that
    ``writes_out`` writes its features into the buffer itself; another map's are copied there. ``extra`` goes to
    the map (a query's :func:`query_options`)."""
    batch, heads, _, dim = x.shape
    hooked = bool(feature_map._forward_hooks or feature_map._forward_pre_hooks)
    if (batch == 1 and x.dtype == torch.float32 and not hooked and getattr(feature_map, "writes_out", False)
            and getattr(feature_map, "folds_input_scale", False)):  # one sequence: its [H, c, d] rows are a view
        return features_in_buffer(feature_map, x[:, :, start:stop], mask, start, "linearize.phi", input_scale=root,
                                  **extra)
    scaled = scratch("linearize.x", (heads, batch, stop - start, dim), x.device)
    part = x[:, :, start:stop].transpose(0, 1)
    if x.dtype == torch.float32:
        torch.mul(part, root, out=scaled)  # the contiguous copy a product needs anyway, scaled on the way
    else:
        scaled.copy_(part).mul_(root)  # to float32 first, as the one-shot path
    return features_in_buffer(feature_map, scaled.transpose(0, 1), mask, start, "linearize.phi", **extra)


def features_in_buffer(feature_map, given, mask, start, name, **extra):
    """``(φ rows [H*B, c, D], log-scale or None)`` of the chunk ``given [B, H, c, d]`` (the map's input) of a
    sequence with the ``[B, N]`` mask ``mask``, starting at token ``start``, in the :func:`scratch` buffer
    ``name`` (head-major): a map that ``writes_out`` writes into it, another map's features are copied there.
    ``extra`` (``input_scale``, ``log_scale``) goes to the map. A map with hooks gets a copy of its input and writes
    nowhere shared: a hook may keep its tensors."""
    batch, heads, size, _ = given.shape
    out = scratch(name, (heads, batch, size, feature_map.feature_dim), given.device)
    if feature_map._forward_hooks or feature_map._forward_pre_hooks:
        given, out = given.clone(), None
    if getattr(feature_map, "writes_out", False) and out is not None:
        phi, log = feature_map.chunk_features(given, mask, start, out=out.transpose(0, 1), **extra)
    else:
        phi, log = feature_map.chunk_features(given, mask, start, **extra)
    rows = phi.transpose(0, 1)
    if out is None or rows.data_ptr() != out.data_ptr() or not rows.is_contiguous():
        rows = scratch(name, (heads, batch, size, phi.shape[-1]), given.device).copy_(rows)
    return rows.view(heads * batch, size, -1), log


def value_guard(real_v, mask, padded, heads, eps):
    """The numerator's guard term ``ε/n·Σ_j v_j`` (the guarded normaliser of the module docstring), in place
    in ``real_v`` (``Σ_j v_j`` over the real keys, ``[H*B, 1, d]``, rows head-major), ``n`` each sequence's
    number of real keys (at least 1): from the ``[B, N]`` mask when ``padded``, else ``N``."""
    if padded:
        n_real = mask.sum(dim=1).repeat(heads).reshape(-1, 1, 1)  # row h·B + b has sequence b's count
        return real_v.mul_(eps / n_real.clamp_min(1.0))
    return real_v.mul_(eps / max(1, mask.shape[1]))


def _chunked_key_state(k, v, feature_map, mask, padded, root, chunk):
    """``(state, key_sum, real_v)``, rows head-major (``h·B + b``): ``Σ_j φ(k_j) v_jᵀ``
    ``[H*B, D, d]`` (a :func:`scratch` buffer), ``Σ_j φ(k_j)`` ``[H*B, 1, D]`` and ``Σ_j v_j``
    ``[H*B, 1, d]``, accumulated chunk by chunk (no full-length temporary); padded keys contribute
    nothing.

    Log-scaled maps: the max over real keys (the shift of :func:`feature_maps`) is kept as a
    running max; when a chunk raises it, the sums so far are multiplied by
    ``exp(old max − new max)`` (:func:`log_scaled_chunk`), so every key ends up scaled by
    ``exp(s_j − max_j s_j)`` exactly as in the one-shot path.
    """
    batch, heads, seq_k, _ = k.shape
    rows, dim_v = batch * heads, v.shape[-1]
    state = key_sum = real_v = top = None  # top: the running max of the keys' log-scales [B, H, 1, 1]
    for start in range(0, seq_k, chunk):
        stop = min(start + chunk, seq_k)
        phi, log = features_of_chunk(feature_map, k, mask, start, stop, root)
        by_head = phi.view(heads, batch, stop - start, -1)
        if log is not None:
            top, rescale = log_scaled_chunk(by_head.transpose(0, 1), log, mask[:, None, start:stop, None], top,
                                             padded)[1:]
            if rescale is not None:  # not the first chunk: the sums so far exist
                state.mul_(rescale.transpose(0, 1).reshape(rows, 1, 1))
                key_sum.mul_(rescale.transpose(0, 1).reshape(rows, 1, 1))
        elif padded:
            by_head.mul_(mask[None, :, start:stop, None])
        if batch == 1 and not padded and v.dtype == torch.float32:  # one sequence: its [H, c, d] rows are a view
            values = v[0, :, start:stop]  # the product reads it in place, faster than a copy and a product
        else:
            values = scratch("linearize.v", (heads, batch, stop - start, dim_v), v.device)
            values.copy_(v[:, :, start:stop].transpose(0, 1))  # float32, head-major
            if padded:  # their φ is 0 already; zeroed values keep them out of Σv too
                values.mul_(mask[None, :, start:stop, None])
            values = values.view(rows, stop - start, dim_v)
        if state is None:
            state = scratch("linearize.state", (rows, phi.shape[-1], dim_v), v.device)
            key_sum, real_v = phi.sum(dim=1, keepdim=True), values.sum(dim=1, keepdim=True)
            torch.bmm(phi.transpose(1, 2), values, out=state)
        else:
            state.baddbmm_(phi.transpose(1, 2), values)
            key_sum += torch.sum(phi, dim=1, keepdim=True, out=scratch("linearize.sum", key_sum.shape, v.device))
            real_v += torch.sum(values, dim=1, keepdim=True, out=scratch("linearize.sum", real_v.shape, v.device))
    return state, key_sum, real_v.view(rows, 1, dim_v)


def _write_chunk_output(phi, state, key_sum, bias, eps, feature_map, out):
    """``(φ(q)·state + ε/n·Σv) / (φ(q)·Σφ(k) + ε)`` (the guarded normaliser of the module
    docstring) for the query rows ``phi [H*B, c, D]``, written into ``out``, a ``[H, B, c, d]``
    view of the output. The normaliser is a vector-matrix ``bmm``, ``Σφ(k)ᵀ·φ(q)ᵀ`` ``[R, 1, c]``: without autograd
    twice as fast as the matrix-vector form :func:`_normalised_output` keeps for training (whose backward is
    faster; 2-core CPU, R, c, D = 96, 512, 64: 0.34 against 0.74 ms forward, 5.9 against 4.9 ms with backward)."""
    heads, batch, size, dim_v = out.shape
    num = torch.baddbmm(bias, phi, state, out=scratch("linearize.v", (heads * batch, size, dim_v), phi.device))
    den = scratch("linearize.den", (heads * batch, 1, size), phi.device)  # a row per sequence: [R, 1, c] is [R, c, 1]
    den = guard_denominator(torch.bmm(key_sum, phi.transpose(1, 2), out=den).add_(eps), eps, feature_map)
    num, den = num.view(heads, batch, size, dim_v), den.view(heads, batch, size, 1)
    if out.dtype == torch.float32:
        torch.div(num, den, out=out)
    else:
        out.copy_(cast_finite(num.div_(den), out.dtype))


def log_scaled_chunk(phi, log, keep, top, padded):
    """``(phi · exp(log − max), new running max, rescale)`` for one chunk of keys of a log-scaled
    map: ``max`` is the running max ``top`` over the real keys so far, this chunk included (``-inf``
    while no real key was seen; then no shift); ``rescale`` ``exp(old − new max)`` ``[B, H, 1, 1]``
    is what the sums of the earlier chunks must be multiplied by (``None`` for the first chunk).
    ``phi [B, H, c, D]`` is scaled in place (no autograd on this path); padded keys (``keep``
    ``[B, 1, c, 1]``, 0) become 0: the mask enters the factor once, as ``-inf`` before the ``exp``."""
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
    # pads: -inf in ``masked``, so exp gives 0 there (one mask, no second multiply by keep)
    factor = torch.sub(masked, shift).clamp_max_(0.0).exp_()
    return phi.mul_(factor), top, rescale


def kernel_matrix(q, k, feature_map, key_padding_mask=None, scale=None):
    """Unnormalised kernel values κ_ij = φ(q_i)ᵀφ(k_j) ``[B,H,Nq,Nk]`` (float32, pads 0)."""
    check_attention_inputs(q, k, None, key_padding_mask, feature_map)
    phi_q, phi_k, _ = feature_maps(q, k, feature_map, key_padding_mask, scale)
    return phi_q @ phi_k.transpose(-1, -2)


def linear_attention_weights(q, k, feature_map, key_padding_mask=None, scale=None, eps=DEFAULT_EPS):
    """The quadratic form Â (float32, ``[B,H,Nq,Nk]``) of the same kernel and normaliser as
    :func:`linear_attention`: rows sum to one over real keys and are zero on padded keys."""
    check_attention_inputs(q, k, None, key_padding_mask, feature_map)
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
    check_attention_inputs(q, k, v, key_padding_mask, feature_map)
    weights = linear_attention_weights(q, k, feature_map, key_padding_mask, scale, eps)
    return cast_finite(weights @ v.float(), v.dtype)


def softmax_attention(q, k, v, key_padding_mask=None, scale=None, dropout=0.0):
    """Exact softmax attention over the real keys with PyTorch's ``scaled_dot_product_attention``
    (Vaswani et al. 2017, eq. 1); a sequence with no real key gets zeros, never NaN."""
    mask = None if key_padding_mask is None else key_padding_mask.to(device=q.device, dtype=torch.bool)[:, None, None]
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, dropout_p=dropout)
    return out if mask is None else torch.nan_to_num(out, nan=0.0)


def softmax_attention_weights(q, k, key_padding_mask=None, scale=None, attn_bias=None):
    """Softmax attention rows ``softmax(q·kᵀ·scale + mask)`` in float32 (the teacher's A).

    Rows of a sequence with no real key are all zero (never NaN).
    """
    check_attention_inputs(q, k, None, key_padding_mask)
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
    check_attention_inputs(q, k, None, key_padding_mask, feature_map)
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    kappa = phi_q @ phi_k.transpose(-1, -2)
    pair_mask = mask[:, None, None, :].expand_as(kappa)
    if q.shape[2] == k.shape[2]:
        pair_mask = pair_mask * mask[:, None, :, None]
    n_pairs = pair_mask.sum().clamp_min(1.0)
    negative = ((kappa < 0).float() * pair_mask).sum() / n_pairs
    zero = (phi_q == 0).float().mean()
    return {"negative_kernel_fraction": float(negative), "zero_feature_fraction": float(zero)}
