"""Metrics against values computed by hand (the working is in the comments)."""

import math

import numpy as np
import pytest

from linearize.data import TaskSpec
from linearize.errors import LinearizeError
from linearize.metrics import compute_metrics, metric_names, primary_metric, top_k_accuracy


def test_accuracy_sst2():
    # 3 of 5 right: positions 0, 1, 3
    assert compute_metrics("sst2", [1, 0, 1, 1, 0], [1, 0, 0, 1, 1]) == {"accuracy": 0.6}


def test_mrpc_f1_accuracy_combined():
    # refs 1 1 1 1 0 0 / preds 1 1 0 0 1 0: TP=2 FN=2 FP=1 TN=1
    # F1 = 2TP / (2TP + FP + FN) = 4/7; accuracy = (TP+TN)/6 = 3/6; combined = (1/2 + 4/7)/2 = 15/28
    out = compute_metrics("mrpc", [1, 1, 0, 0, 1, 0], [1, 1, 1, 1, 0, 0])
    assert list(out) == ["accuracy", "f1", "combined"]
    assert out["accuracy"] == pytest.approx(0.5)
    assert out["f1"] == pytest.approx(4 / 7)
    assert out["combined"] == pytest.approx(15 / 28)
    # logits are arg-maxed: the same predictions as scores
    logits = np.array([[0, 1], [0, 1], [1, 0], [1, 0], [0, 1], [1, 0]], dtype=float)
    assert compute_metrics("qqp", logits, [1, 1, 1, 1, 0, 0]) == pytest.approx(out)


def test_f1_without_positive_predictions_is_zero():
    # TP = 0: precision undefined, F1 = 0 (GLUE's convention for a degenerate classifier)
    assert compute_metrics("mrpc", [0, 0, 0], [1, 0, 1])["f1"] == 0.0


def test_cola_matthews_correlation():
    # positives: preds 1 1 1 1 0 -> TP=4 FN=1; negatives: preds 1 1 0 0 0 -> FP=2 TN=3
    # MCC = (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (12 - 2) / sqrt(6*5*5*4) = 10/sqrt(600) = 1/sqrt(6)
    refs = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    preds = [1, 1, 1, 1, 0, 1, 1, 0, 0, 0]
    assert compute_metrics("cola", preds, refs) == {"matthews_correlation": pytest.approx(1 / math.sqrt(6))}
    # all one class: the denominator is 0 and MCC is defined as 0
    assert compute_metrics("cola", [1] * 4, [1, 0, 1, 0]) == {"matthews_correlation": 0.0}


def test_stsb_pearson_spearman_combined():
    # x = 1 2 3 4, y = 1 3 2 10: dx = -1.5 -.5 .5 1.5, dy = -3 -1 -2 6 (mean 4)
    # Pearson = Σdxdy / sqrt(Σdx² Σdy²) = 13 / sqrt(5 * 50) = 13 / sqrt(250)
    # Spearman: ranks of y = 1 3 2 4 -> Pearson of ranks: dr = -1.5 .5 -.5 1.5, Σ = 4 / sqrt(5*5) = 0.8
    out = compute_metrics("stsb", np.array([[1.0], [2.0], [3.0], [4.0]]), [1, 3, 2, 10])
    assert out["pearson"] == pytest.approx(13 / math.sqrt(250))
    assert out["spearmanr"] == pytest.approx(0.8)
    assert out["combined"] == pytest.approx((13 / math.sqrt(250) + 0.8) / 2)
    assert primary_metric("stsb") == "combined"
    # constant predictions: correlation is undefined; reported as 0 so early stopping stays sane
    assert compute_metrics("stsb", [2.0, 2.0, 2.0], [1, 2, 3])["pearson"] == 0.0


def test_mnli_matched_and_mismatched_accuracy():
    # argmax rows -> 1 0 2 1 against 1 0 2 2: 3 of 4
    logits = [[0.1, 2.0, 0.3], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    assert compute_metrics("mnli", logits, [1, 0, 2, 2]) == {"accuracy": 0.75}
    assert compute_metrics("mnli_mismatched", logits, [1, 1, 1, 1]) == {"accuracy": 0.5}


def test_image_top1_top5():
    # 7 classes, scores 0..6 for every example: the top five are classes 6 5 4 3 2
    # labels 6 (1st: top-1 and top-5), 2 (5th: top-5 only), 1 (6th: neither) -> top-1 1/3, top-5 2/3
    scores = np.tile(np.arange(7.0), (3, 1))
    out = compute_metrics("fashion-mnist", scores, [6, 2, 1])
    assert out == {"accuracy": pytest.approx(1 / 3), "top5_accuracy": pytest.approx(2 / 3)}
    assert top_k_accuracy(scores[:, :3], np.array([0, 1, 2]), k=5) == 1.0  # fewer classes than k
    with pytest.raises(ValueError, match=r"needs \(N, C\) scores"):
        compute_metrics("fashion-mnist", [6, 2, 1], [6, 2, 1])


def test_task_tables_and_specs():
    assert primary_metric("cola") == "matthews_correlation"
    assert primary_metric("SST-2") == "accuracy"
    assert primary_metric("mrpc") == "combined"
    assert metric_names("glue/qqp") == ("accuracy", "f1", "combined")
    assert primary_metric("fashion-mnist") == "accuracy"
    spec = TaskSpec(name="mine", num_labels=3, label_names=("a", "b", "c"), text_keys=("text",))
    assert compute_metrics(spec, [0, 1, 2, 2], [0, 1, 2, 0]) == {"accuracy": 0.75}
    assert primary_metric(spec) == "accuracy"
    with pytest.raises(LinearizeError, match="no metrics defined for task 'squad'"):
        compute_metrics("squad", [0], [0])


def test_bad_inputs():
    with pytest.raises(ValueError, match="2 predictions for 3 references"):
        compute_metrics("sst2", [0, 1], [0, 1, 1])
    with pytest.raises(ValueError, match="class ids"):
        compute_metrics("sst2", [0.2, 0.7], [0, 1])
    with pytest.raises(ValueError, match=r"\(N,\) or \(N, 1\)"):
        compute_metrics("stsb", [[1.0, 2.0]], [1.0])
