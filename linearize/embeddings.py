"""Sentence embeddings: pooling as sentence-transformers does it and the embedding-distillation
loss (the agreement metrics of an embedding student with its teacher are in
:mod:`linearize.metrics`).

linearize computes these itself (sentence-transformers is not needed): the pooling a folder's
``1_Pooling/config.json`` and ``modules.json`` describe (:func:`folder_pooling`), applied to the
encoder's last hidden state (:func:`embed`), gives exactly ``SentenceTransformer(dir).encode``
for a Transformer → Pooling (→ Normalize) model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import LinearizeError

#: sentence-transformers' pooling modes, in the order its Pooling module concatenates them
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len", "lasttoken")
_CONFIG_KEYS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "mean": "pooling_mode_mean_tokens",
                "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens", "lasttoken": "pooling_mode_lasttoken"}


@dataclass(frozen=True)
class Pooling:
    """How token states become one sentence vector: ``modes`` concatenated, then L2-normalised
    when ``normalize``; ``max_length`` is the folder's ``max_seq_length`` (None: not set)."""

    modes: tuple[str, ...] = ("mean",)
    normalize: bool = True
    max_length: int | None = None

    def __post_init__(self):
        unknown = [mode for mode in self.modes if mode not in POOLING_MODES]
        if unknown or not self.modes:
            raise LinearizeError(f"pooling modes {list(self.modes)} are not supported; linearize pools with "
                                 f"{', '.join(POOLING_MODES)}")


def pooling_from_files(files):
    """The :class:`Pooling` of a sentence-transformers files dict
    (``convert.sentence_transformers.read_files``); mean pooling, normalised, when ``files`` is None."""
    from .convert.sentence_transformers import MODULES, pooling_config

    if not files:
        return Pooling()
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in files.get(MODULES, [])]
    extra = [kind for kind in kinds if kind not in ("Transformer", "Pooling", "Normalize")]
    if extra:
        raise LinearizeError(f"the model's sentence-transformers modules include {', '.join(extra)}: linearize's "
                             "embedding task handles Transformer → Pooling (→ Normalize) models only")
    config, normalize, max_length = pooling_config(files)
    config = config or {}
    if config.get("pooling_mode"):  # newer sentence-transformers: one named mode
        modes = (str(config["pooling_mode"]).replace("_tokens", "").replace("_token", ""),)
    else:
        modes = tuple(mode for mode in POOLING_MODES if config.get(_CONFIG_KEYS[mode]))
    return Pooling(modes=modes or ("mean",), normalize=normalize, max_length=max_length)


def folder_pooling(source):
    """The :class:`Pooling` of a model folder, alias or Hub id (its sentence-transformers files),
    or of a converted folder (the files its conversion record carries)."""
    import json
    from pathlib import Path

    from .convert.loading import resolve_model_name
    from .convert.sentence_transformers import read_files

    path = Path(resolve_model_name(str(source))) / "config.json"
    if path.is_file():
        from .convert.record import ConversionRecord

        record = ConversionRecord.from_config(json.loads(path.read_text()))
        if record is not None and record.sentence_transformers_files:
            return pooling_from_files(record.sentence_transformers_files)
    return pooling_from_files(read_files(source))


def pool(hidden, mask, pooling):
    """Sentence vectors ``[B, D·len(modes)]`` from token states ``hidden [B, T, D]`` and the
    attention ``mask [B, T]``: the pooling strategies of Reimers & Gurevych 2019, "Sentence-BERT:
    Sentence Embeddings using Siamese BERT-Networks", §3 (CLS token, mean or max over the tokens;
    mean_sqrt_len divides the sum by √n, lasttoken takes the last real token), concatenated in
    sentence-transformers' order, then u/‖u‖ when ``pooling.normalize``."""
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    count = mask.sum(1).clamp(min=1e-9)
    parts = []
    for mode in pooling.modes:
        if mode == "cls":
            parts.append(hidden[:, 0])
        elif mode == "max":
            parts.append(hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min).max(1).values)
        elif mode == "mean":
            parts.append((hidden * mask).sum(1) / count)
        elif mode == "mean_sqrt_len":
            parts.append((hidden * mask).sum(1) / count.sqrt())
        else:  # lasttoken: the last position the mask keeps (right padding)
            last = mask[..., 0].cumsum(1).argmax(1)
            parts.append(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
    vectors = torch.cat(parts, dim=-1)
    return torch.nn.functional.normalize(vectors, dim=-1) if pooling.normalize else vectors


def embed(model, inputs, pooling):
    """``model``'s sentence embeddings of a tokenised batch (labels and other non-inputs ignored)."""
    inputs = {k: v for k, v in inputs.items() if k not in ("labels", "label", "idx")}
    hidden = model(**inputs).last_hidden_state
    mask = inputs.get("attention_mask")
    if mask is None:
        mask = torch.ones(hidden.shape[:2], dtype=hidden.dtype, device=hidden.device)
    return pool(hidden, mask, pooling)


def distillation_loss(student, teacher):
    """Embedding distillation: the mean squared error between the student's and the teacher's
    sentence embeddings, Reimers & Gurevych 2020, "Making Monolingual Sentence Embeddings
    Multilingual using Knowledge Distillation", eq. 1 (1/|β| Σ_j ‖M(s_j) − M̂(s_j)‖², here with
    student M̂ and teacher M on the same sentence), averaged over the embedding's dimensions too."""
    return torch.nn.functional.mse_loss(student.float(), teacher.float())


def similarity_distillation_loss(student, teacher, temperature, anchors=None):
    """How each text ranks other texts, distilled (CompRess: Abbasi Koohpayegani et al. 2020, "CompRess:
    Self-Supervised Learning by Compressing Representations", §3, its "1q" form: the student's similarity
    distribution over anchor points, the teacher's embeddings of other instances, trained toward the teacher's by
    KL divergence). Over a batch of ``b`` texts with student embeddings ``s_i`` and teacher embeddings ``t_i`` (both
    L2-normalised) and anchors ``a_j`` (``anchors``: CompRess's memory bank of teacher embeddings, e.g. every
    training text's; None: the batch's own ``t_j``):

        p_i(j) = softmax_j(t_iᵀa_j / τ),   q_i(j) = softmax_j(s_iᵀa_j / τ),   loss = (1/b) Σ_i KL(p_i ‖ q_i)

    over the anchors other than text ``i`` itself (0 at s = t). The MSE of :func:`distillation_loss` pulls each
    ``s_i`` toward ``t_i``; this term weighs the directions that change which texts are its nearest neighbours, what
    a retrieval top-k compares. The text's own embedding is left out (with it, ``p_i`` is nearly all on ``i`` and
    says nothing about the others): every anchor with ``t_iᵀa_j`` within 1e-5 of 1, so an identical text's too."""
    functional = torch.nn.functional
    student = functional.normalize(student.float(), dim=-1)
    teacher = functional.normalize(teacher.float(), dim=-1)
    anchors = teacher if anchors is None else functional.normalize(anchors.float().to(teacher.device), dim=-1)
    teacher_similarity = teacher @ anchors.T  # [b, n]
    own = teacher_similarity > 1 - 1e-5  # text i's own embedding (and any identical text's)
    if bool(own.all(dim=-1).any()):  # a text with no other anchor (a batch of one, an epoch's last): nothing to rank
        return student.sum() * 0.0

    def ranking(similarity):  # [b, n]: log softmax of each text's similarities to the anchors, its own left out
        return torch.log_softmax((similarity / temperature).masked_fill(own, -1e9), dim=-1)

    # the own anchors' log-probabilities are ~-1e9 in both: exp(-1e9) = 0 weighs their (finite) difference out
    return functional.kl_div(ranking(student @ anchors.T), ranking(teacher_similarity), reduction="batchmean",
                             log_target=True)
