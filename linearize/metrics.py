"""Task metrics on scikit-learn and SciPy (the ``evaluate`` package fetches its metric scripts
from the Hub, so it cannot run offline).

GLUE's metrics as defined in the GLUE paper (Wang et al., ICLR 2019, Table 1) and its
official ``glue`` metric: accuracy; binary F1 of the positive class (label 1) plus accuracy
for MRPC and QQP; Matthews correlation for CoLA; Pearson and Spearman correlation for STS-B.
Where a task has two numbers, ``combined`` is their mean — what the GLUE score averages for
that task — and is the primary metric for early stopping. MNLI is scored per split
(matched, mismatched): call ``compute_metrics("mnli", ...)`` on each. Images: top-1
(``accuracy``) and top-5 accuracy (``top5_accuracy``, which needs scores, not class ids).
Sentence embeddings: agreement with the teacher's embeddings (:func:`agreement`: mean cosine and
top-10 retrieval overlap) and the STS Spearman correlation (:func:`similarity_spearman`).

``predictions`` may be class ids ``(N,)`` or scores/logits ``(N, C)`` (arg-maxed);
regression predictions are ``(N,)`` or ``(N, 1)``.
"""

from __future__ import annotations

import numpy as np

from .errors import LinearizeError

IMAGE_METRICS = ("accuracy", "top5_accuracy")
REGRESSION_METRICS = ("pearson", "spearmanr", "combined")
TOP_K = 10  # the embedding retrieval overlap's k
_EXTRA_TASKS = {
    "mnli_matched": ("accuracy",), "mnli_mismatched": ("accuracy",), "mnli-mm": ("accuracy",),
    "moviereviews": ("accuracy",), "moviereviews-long": ("accuracy",), "text": ("accuracy",),
    "classification": ("accuracy",),
    "fashion-mnist": IMAGE_METRICS, "image": IMAGE_METRICS, "regression": REGRESSION_METRICS,
}


# ---------------------------------------------------------------- the metrics themselves

def accuracy(pred_ids, labels):
    return float(np.mean(pred_ids == labels))


def f1(pred_ids, labels):
    """F1 of the positive class 1 (binary, as GLUE scores MRPC and QQP); 0 when it is never predicted nor present."""
    from sklearn.metrics import f1_score

    return float(f1_score(labels, pred_ids, pos_label=1, average="binary", zero_division=0))


def matthews_correlation(pred_ids, labels):
    """Matthews (1975) correlation coefficient, as GLUE scores CoLA; 0 when undefined."""
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(labels, pred_ids))


def _correlation(function, values, labels):
    if len(values) < 2 or np.all(values == values[0]) or np.all(labels == labels[0]):
        return 0.0  # undefined for a constant input; 0 (no correlation captured) keeps early stopping sane
    return float(function(values, labels)[0])


def pearson(values, labels):
    from scipy.stats import pearsonr

    return _correlation(pearsonr, values, labels)


def spearmanr(values, labels):
    from scipy.stats import spearmanr as scipy_spearmanr

    return _correlation(scipy_spearmanr, values, labels)


def top_k_accuracy(scores, labels, k=5):
    """Fraction of examples whose label is among the ``k`` highest scores (all of them if fewer than ``k``)."""
    k = min(k, scores.shape[1])
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    return float(np.mean(np.any(top == labels[:, None], axis=1)))


# ---------------------------------------------------------------- embeddings: agreement with the teacher

def unit_rows(vectors):
    """``vectors`` (N, D) as float64 rows scaled to length 1 (a zero row stays zero)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def mean_cosine(student, teacher):
    """Mean over sentences of cos(student_i, teacher_i)."""
    return float(np.mean(np.sum(unit_rows(student) * unit_rows(teacher), axis=1)))


def top_k_overlap(student, teacher, k=TOP_K):
    """Retrieval agreement on a corpus: every sentence queries the corpus (itself excluded) by cosine
    similarity, under the teacher's and the student's embeddings; the mean over queries of
    |top-k(teacher) ∩ top-k(student)| / k (k shrinks to the corpus size − 1 when smaller)."""
    student, teacher = unit_rows(student), unit_rows(teacher)
    n = len(teacher)
    k = min(k, n - 1)
    if k < 1:
        raise LinearizeError("the top-k retrieval overlap needs at least two sentences")
    overlaps = []
    for similarities in (teacher @ teacher.T, student @ student.T):
        np.fill_diagonal(similarities, -np.inf)  # a sentence does not retrieve itself
        overlaps.append(np.argpartition(-similarities, k - 1, axis=1)[:, :k])
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(*overlaps)]))


def similarity_spearman(first, second, gold):
    """Spearman correlation between cos(first_i, second_i) and the gold similarity scores (the STS
    benchmark's measure, Cer et al. 2017, "SemEval-2017 Task 1: Semantic Textual Similarity", as
    Reimers & Gurevych 2019 §4.1 use it); 0 when either side is constant."""
    cosine = np.sum(unit_rows(first) * unit_rows(second), axis=1)
    return spearmanr(cosine, np.asarray(gold, dtype=np.float64))


def agreement(student, teacher):
    """``{"cosine", "top10_overlap"}`` of student against teacher embeddings of one corpus."""
    return {"cosine": mean_cosine(student, teacher), f"top{TOP_K}_overlap": top_k_overlap(student, teacher)}


# name -> (function, what it takes): "ids" class ids, "scores" (N, C) scores, "values" regression values
METRICS = {
    "accuracy": (accuracy, "ids"),
    "f1": (f1, "ids"),
    "matthews_correlation": (matthews_correlation, "ids"),
    "pearson": (pearson, "values"),
    "spearmanr": (spearmanr, "values"),
    "top5_accuracy": (lambda scores, labels: top_k_accuracy(scores, labels, 5), "scores"),
}


# ---------------------------------------------------------------- tasks

def metric_names(task) -> tuple[str, ...]:
    """The metrics reported for ``task``: a GLUE task name, another known name, or a ``TaskSpec``."""
    if hasattr(task, "metric_names"):
        return tuple(task.metric_names)
    from .data.glue import GLUE_TASKS, glue_task_name

    key = str(task).strip().lower()
    if key in _EXTRA_TASKS:
        return _EXTRA_TASKS[key]
    glue = glue_task_name(key)
    if glue is not None:
        return GLUE_TASKS[glue].metrics
    known = sorted(set(GLUE_TASKS) | set(_EXTRA_TASKS))
    raise LinearizeError(f"no metrics defined for task {task!r}; known tasks: {', '.join(known)}")


def primary_metric(task) -> str:
    """The metric early stopping and model selection maximise for ``task``."""
    if hasattr(task, "primary_metric"):
        return task.primary_metric
    from .data.glue import GLUE_TASKS, glue_task_name

    names = metric_names(task)
    glue = glue_task_name(task)
    if glue is not None:
        return GLUE_TASKS[glue].primary_metric
    return "combined" if "combined" in names else names[0]


def is_regression(task) -> bool:
    """True for a regression task (STS-B), given its ``TaskSpec`` or its GLUE name."""
    if hasattr(task, "is_regression"):
        return bool(task.is_regression)
    from .data.glue import GLUE_TASKS, glue_task_name

    glue = glue_task_name(task)
    return glue is not None and GLUE_TASKS[glue].is_regression


def compute_metrics(task, predictions, references) -> dict[str, float]:
    """``{metric: value}`` for ``task`` (see ``metric_names``); ``combined`` is the mean of the others.
    An embedding task (``TaskSpec.is_embedding``) scores embeddings ``(N, D)`` against the teacher's
    (``references``, ``(N, D)``) with :func:`agreement`."""
    if getattr(task, "is_embedding", False):
        return agreement(predictions, references)
    names = metric_names(task)
    preds = np.asarray(predictions)
    labels = np.asarray(references)
    if labels.ndim != 1:
        raise ValueError(f"references must be one-dimensional, got shape {labels.shape}")
    if len(preds) != len(labels):
        raise ValueError(f"{len(preds)} predictions for {len(labels)} references")
    if len(labels) == 0:
        raise ValueError("no predictions to score")
    results = {}
    for name in names:
        if name == "combined":
            continue
        if name not in METRICS:
            raise LinearizeError(f"unknown metric {name!r}; metrics: {', '.join(METRICS)}, combined")
        function, takes = METRICS[name]
        if takes == "values":
            results[name] = function(_values(preds), labels.astype(np.float64))
        elif takes == "scores":
            if preds.ndim != 2:
                raise ValueError(f"{name} needs (N, C) scores, got predictions of shape {preds.shape}")
            results[name] = function(preds, labels.astype(np.int64))
        else:
            results[name] = function(_class_ids(preds), labels.astype(np.int64))
    if "combined" in names:
        results["combined"] = float(np.mean(list(results.values())))
    return {name: results[name] for name in names}


def standard_error(task, predictions, references, metric, draws=200, seed=0):
    """The standard error of ``metric`` of ``task`` on these examples, by the delete-d jackknife
    (Shao & Wu 1989, "A general theory for jackknife variance estimation", Ann. Statist. 17(3),
    the delete-d variance estimator): the metric recomputed on ``draws`` random subsets that each
    leave out d = n // 2 of the n examples (drawn without replacement, ``seed``),

        SE² = r / (d · draws) · Σ_s (θ_s − θ̄)²,   r = n − d,

    which for a mean over examples (accuracy, mean cosine) is its variance divided by n, and
    which holds for the metrics that are not means (F1, Matthews, correlations, top-k overlap)
    alike. Subsets whose metric is undefined (not finite) are left out; 0.0 when fewer than 4
    examples or 2 defined subsets."""
    predictions, references = np.asarray(predictions), np.asarray(references)
    n = len(references)
    if n < 4:
        return 0.0
    d, rng = n // 2, np.random.default_rng(seed)
    values = []
    for _ in range(draws):
        kept = np.sort(rng.choice(n, n - d, replace=False))
        values.append(compute_metrics(task, predictions[kept], references[kept])[metric])
    values = np.asarray([v for v in values if np.isfinite(v)], dtype=np.float64)
    if len(values) < 2:
        return 0.0
    return float(np.sqrt((n - d) / d * np.mean((values - values.mean()) ** 2)))


def _class_ids(preds):
    if preds.ndim == 2:
        return preds.argmax(axis=1)
    if preds.ndim == 1 and (np.issubdtype(preds.dtype, np.integer) or np.all(np.mod(preds, 1) == 0)):
        return preds.astype(np.int64)
    raise ValueError(f"pass class ids (N,) or scores (N, C) for a classification task, got shape {preds.shape} "
                     f"of {preds.dtype}")


def _values(preds):
    if preds.ndim == 2 and preds.shape[1] == 1:
        preds = preds[:, 0]
    if preds.ndim != 1:
        raise ValueError(f"regression predictions must be (N,) or (N, 1), got {preds.shape}")
    return preds.astype(np.float64)
