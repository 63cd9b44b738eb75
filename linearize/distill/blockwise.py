"""Stage 1's attention loss over blocks of query rows: the same loss without an N×N matrix.

The loss is Hedgehog's attention cross-entropy (Zhang et al. 2024, "The Hedgehog & the
Porcupine", §4.1 eq. 5; LUNA §10.2; docs/methods.md, "Stage 1: attention distillation"),

    CE = (1/R) Σ_{real rows i} −Σ_j A_ij log Â_ij,

with ``A_i = softmax(q_iᵀK·scale + mask)`` and ``Â_i`` the normalised kernel row
(Katharopoulos et al. 2020, "Transformers are RNNs", eq. 4-6; :mod:`linearize.attention.core`).
Both rows depend on their own query and on every key only, so the sum over rows splits over
blocks of query rows exactly: each block of ``b`` rows forms its ``b×N`` teacher and student
rows, adds its weighted row sums, and is freed. In training every block runs under
``torch.utils.checkpoint``, which keeps only the block's inputs and recomputes its rows in
backward, so the memory beyond the O(N·D) features is O(b·N), never O(N²). The row entropies
that are logged (for the KL = CE − H(A)), the optional output MSE (LoLCATs, Zhang et al. 2025,
§3.1) and the negative-weight mass Σ_j max(−Â_ij, 0) (the penalty of :mod:`linearize.distill.losses`)
are row sums too and are taken in the same pass; so is the exact softmax output that feeds the
next layer.

A block is also held under :data:`BLOCK_ELEMENTS` elements (its ``B×H×b×N`` rows; 64 MiB of
float32): ``block_size`` query rows at most, fewer when the batch, heads and keys are many. Every
block then allocates temporaries of one small size that the allocator hands out again block after
block; blocks of hundreds of MiB cost the kernel page faults on every block or, kept in the heap by
``linearize.allocator``, fragmented it (measured: ~3.6× the peak memory; docs/experiments/cpu-allocator).

The features φ(Q) and φ(K) are computed once, for the whole sequence
(:func:`linearize.attention.core.feature_maps`), so a map whose features depend on the whole
sequence (a per-sequence statistic, a position) gives exactly the one-shot features.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

from ..attention.core import DEFAULT_EPS, feature_maps, softmax_attention_weights
from .losses import row_cross_entropy, row_entropy, row_negative_mass, row_squared_error

#: the most elements a block's rows (``B×H×b×N``) hold: 64 MiB of float32
BLOCK_ELEMENTS = 2**24


@dataclass
class BlockwiseTerms:
    """The stage-1 terms of one layer, averaged over heads and real query rows as the one-shot
    losses are: ``ce``, ``mse`` (None unless asked for) and ``negative`` (the negative-weight mass
    P; with a gradient only when asked for) carry gradients to the feature maps; the entropies are
    statistics; ``out`` is the exact softmax attention output ``[B,H,N,d]``."""

    ce: torch.Tensor
    mse: torch.Tensor | None
    teacher_entropy: torch.Tensor
    student_entropy: torch.Tensor
    out: torch.Tensor
    negative: torch.Tensor


def blockwise_distillation_terms(q, k, v, feature_map, key_padding_mask=None, scale=None, block_size=512,
                                 with_mse=False, with_negative_grad=False, eps=DEFAULT_EPS):
    """Stage 1's terms for one layer, ``block_size`` query rows at a time (see the module docstring).

    ``q, k, v``: ``[B,H,N,d]``; the teacher rows take no gradient (they are the target). Equal to
    ``attention_cross_entropy(softmax_attention_weights(...), linear_attention_weights(...),
    query_mask)`` (and the entropies, the output MSE, ``negative_weight_mass``) up to float rounding,
    and so are the gradients with respect to ``q``, ``k`` and the feature map's parameters.
    ``with_mse`` / ``with_negative_grad``: the output MSE is computed, the negative mass carries a
    gradient, only when asked, i.e. when the caller's loss uses them. A term with a graph that is
    never back-propagated would keep every block's recomputed rows alive (non-reentrant checkpoint
    frees a recomputed tensor when backward reads it), N×N in all.
    """
    heads, seq_q, seq_k = q.shape[1], q.shape[2], k.shape[2]
    block = rows_per_block(q.shape[0], heads, seq_k, block_size)
    phi_q, phi_k, mask = feature_maps(q, k, feature_map, key_padding_mask, scale)
    # the query rows' weights: the keys' mask for self-attention, else every row (as _row_mean)
    rows = mask if seq_q == seq_k and key_padding_mask is not None else torch.ones(q.shape[0], seq_q, device=q.device)
    grad = torch.is_grad_enabled() and (phi_q.requires_grad or phi_k.requires_grad)
    sums = [0.0] * 5  # ce, mse, negative mass, teacher entropy, student entropy (weighted row sums)
    out = torch.empty(*v.shape[:2], seq_q, v.shape[-1], dtype=v.dtype, device=v.device)
    for start in range(0, seq_q, block):
        stop = min(start + block, seq_q)
        step = partial(_block_sums, feature_map=feature_map, start=start, key_padding_mask=key_padding_mask,
                       scale=scale, eps=eps, with_mse=with_mse, with_negative_grad=with_negative_grad)
        args = (phi_q[:, :, start:stop], phi_k, mask, rows[:, start:stop], q[:, :, start:stop], k, v)
        if grad:
            *parts, out_block = checkpoint(step, *args, use_reentrant=False, preserve_rng_state=False)
        else:
            *parts, out_block = step(*args)
        sums = [total + part for total, part in zip(sums, parts)]
        out[:, :, start:stop] = out_block
    count = (rows.sum() * heads).clamp_min(1.0)
    ce, mse, negative, h_teacher, h_student = (total / count for total in sums)
    return BlockwiseTerms(ce, mse if with_mse else None, h_teacher, h_student, out, negative)


def rows_per_block(batch, heads, keys, block_size):
    """Query rows per block: ``block_size`` at most, and as many as keep the block's
    ``batch × heads × rows × keys`` under :data:`BLOCK_ELEMENTS` (one row at least)."""
    return max(1, min(int(block_size), BLOCK_ELEMENTS // max(1, batch * heads * keys)))


def _block_sums(phi_q, phi_k, mask, rows, q, k, v, *, feature_map, start, key_padding_mask, scale, eps, with_mse,
                with_negative_grad):
    """One block's weighted row sums ``(ce, mse, negative mass, H(A), H(Â))`` and its exact softmax output, for
    the query rows ``start ..`` (the student's rows: ``feature_map.block_rows``, the hybrid rows of a hybrid
    map); the teacher rows, the output and the entropies are computed without autograd."""
    weights = rows[:, None, :]  # [B,1,b]: 1 for a real query row
    with torch.no_grad():
        teacher = softmax_attention_weights(q, k, key_padding_mask, scale)
        out = (teacher @ v.float()).to(v.dtype)
    student = feature_map.block_rows(q, k, phi_q, phi_k, mask, start, scale, eps)
    ce = (row_cross_entropy(teacher, student) * weights).sum()
    mse = (row_squared_error(student @ v.detach().float(), out) * weights).sum() if with_mse else ce.new_zeros(())
    negative = (row_negative_mass(student if with_negative_grad else student.detach()) * weights).sum()
    with torch.no_grad():
        h_teacher = (row_entropy(teacher) * weights).sum()
        h_student = (row_entropy(student.detach().clamp_min(0)) * weights).sum()
    return ce, mse, negative, h_teacher, h_student, out
