"""Stage-1 attention-distillation losses (Hedgehog, Zhang et al. 2024, §4.1 eq. 5; LUNA §10.2;
Flexformer Appendix A.3).

Per layer and head, with teacher rows ``A_i = softmax(q_iᵀK·scale + mask)`` and student rows
``Â_i`` (the quadratic form of the feature-map kernel):

    CE = −Σ_j A_ij log Â_ij,      KL = Σ_j A_ij (log A_ij − log Â_ij) = CE − H(A_i)

averaged over real (non-padded) query rows and heads. The log is clamped at 1e-12 so a zero or
negative student weight (Flexformer's trigonometric kernels) never gives inf.

A clamped weight gets no gradient from the CE, so for a map whose kernel can be negative
(``FeatureMap.nonnegative`` False: Flexformer) stage 1 adds a penalty on the negative weights,

    P = mean over real query rows (and heads) of Σ_j max(−Â_ij, 0),

weighted by ``DistillConfig.negative_weight_penalty`` (λ): loss = CE + λ·P. Flexformer's own
loss (Appendix A.3) is the plain CE and is undefined where a weight is negative; P is linearize's
(docs/experiments/flexformer-probe/RESULTS.md). For a non-negative map P is exactly zero.
"""

from __future__ import annotations

import torch

LOG_FLOOR = 1e-12


def _row_mean(values, query_mask):
    """Mean of ``[B,H,N]`` over heads and real query rows."""
    if query_mask is None:
        return values.mean()
    weights = query_mask.to(values.dtype)[:, None, :].expand_as(values)
    return (values * weights).sum() / weights.sum().clamp_min(1.0)


def row_cross_entropy(teacher, student):
    """Per-row CE ``−Σ_j A_ij log Â_ij`` ``[B,H,Nq]`` of rows ``[B,H,Nq,Nk]``."""
    return -(teacher * student.clamp_min(LOG_FLOOR).log()).sum(-1)


def row_negative_mass(student):
    """Per-row negative mass ``Σ_j max(−Â_ij, 0)`` ``[B,H,Nq]`` of rows ``[B,H,Nq,Nk]``."""
    return torch.relu(-student).sum(-1)


def negative_weight_mass(student, query_mask=None):
    """The negative-weight penalty P: the mean of ``Σ_j max(−Â_ij, 0)`` over real query rows."""
    return _row_mean(row_negative_mass(student), query_mask)


def row_entropy(weights):
    """Per-row entropy ``H(A_i) = −Σ_j A_ij log A_ij`` ``[B,H,Nq]``."""
    return -(weights * weights.clamp_min(LOG_FLOOR).log()).sum(-1)


def attention_cross_entropy(teacher, student, query_mask=None):
    """CE between teacher rows and student rows ``[B,H,Nq,Nk]`` (query_mask ``[B,Nq]``, 1 = real)."""
    return _row_mean(row_cross_entropy(teacher, student), query_mask)


def attention_entropy(weights, query_mask=None):
    """Mean row entropy H(A_i) = −Σ_j A_ij log A_ij."""
    return _row_mean(row_entropy(weights), query_mask)


def attention_kl(teacher, student, query_mask=None):
    """KL(A ‖ Â) = CE − H(A), averaged like the CE."""
    return attention_cross_entropy(teacher, student, query_mask) - attention_entropy(teacher, query_mask)


def output_mse(student_out, teacher_out, query_mask=None):
    """Mean squared error of the attention outputs ``[B,H,N,d]`` over real query rows (the
    output-matching term LoLCATs uses beside attention transfer, Zhang et al. 2025 §3.1)."""
    return _row_mean(row_squared_error(student_out, teacher_out), query_mask)


def row_squared_error(student_out, teacher_out):
    """Per-row mean squared error ``[B,H,N]`` of attention outputs ``[B,H,N,d]``."""
    return (student_out.float() - teacher_out.float()).pow(2).mean(-1)


def logit_distillation(student_logits, teacher_logits, temperature=2.0, regression=False):
    """Knowledge distillation of the task outputs (Hinton et al. 2015, "Distilling the Knowledge
    in a Neural Network", §2): ``T²·KL(softmax(z_t/T) ‖ softmax(z_s/T))`` averaged over the batch
    (the T² keeps its gradient scale independent of T); for a regression head (STS-B) the mean
    squared error between the two predictions. A stage-2 lever of linearize's (not in the
    linear-attention papers): the converted student fine-tunes toward the softmax teacher's
    outputs as well as the labels."""
    if regression:
        return (student_logits.float() - teacher_logits.float()).pow(2).mean()
    t = float(temperature)
    log_student = torch.log_softmax(student_logits.float() / t, dim=-1)
    log_teacher = torch.log_softmax(teacher_logits.float() / t, dim=-1)
    kl = (log_teacher.exp() * (log_teacher - log_student)).sum(-1)
    return kl.mean() * t * t
