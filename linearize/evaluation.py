"""Prediction and scoring: a model's outputs over a data loader and the task's metrics of them
(the metrics themselves are in :mod:`linearize.metrics`). Stage 2 selects on these, the pipeline
scores with them."""

from __future__ import annotations

import numpy as np
import torch

from .errors import LinearizeError
from .training import ProgressBar, evaluation_shards


def outputs_of(model, inputs, task=None):
    """What ``task`` scores ``model`` on: an embedding task's pooled sentence embeddings
    (``TaskSpec.embedding``), else the logits."""
    if getattr(task, "is_embedding", False):
        from .embeddings import embed

        return embed(model, inputs, task.embedding)
    return model(**inputs).logits


@torch.no_grad()
def predict(model, loader, device=None, max_batches=None, description=None, task=None):
    """``(logits [N, C], labels [N])`` of ``model`` over ``loader`` (numpy, float32/int); with a
    ``description``, a progress bar (an embedding ``task``: embeddings [N, D] and the teacher's
    embeddings as labels). Under several processes each predicts its share of the
    batches and every process gets all ``N`` predictions, in order and each once
    (:func:`linearize.training.evaluation_shards`)."""
    was_training = model.training
    model.eval()
    device = device or next(model.parameters()).device
    all_logits, all_labels = [], []
    with evaluation_shards(loader) as (shard, gather):
        total = len(shard) if max_batches is None else min(len(shard), max_batches)
        bar = ProgressBar(total, 0, description, description is not None)
        for step, batch in enumerate(shard):
            if max_batches is not None and step >= max_batches:
                break
            labels = batch.get("labels", batch.get("label"))
            inputs = {k: v.to(device) for k, v in batch.items() if k not in ("labels", "label", "idx")}
            logits = gather(outputs_of(model, inputs, task))
            all_logits.append(logits.float().cpu())
            if labels is not None:
                all_labels.append(gather(labels.to(device)).cpu())
            bar.update(step + 1)
        bar.close()
    model.train(was_training)
    logits = torch.cat(all_logits).numpy() if all_logits else np.zeros((0, 0), np.float32)
    labels = torch.cat(all_labels).numpy() if all_labels else None
    return logits, labels


def evaluate(model, loader, task, device=None, max_batches=None, description=None):
    """The task's metrics (``linearize.metrics``) of ``model`` on one split (``description``: show
    a progress bar)."""
    from .metrics import compute_metrics

    logits, labels = predict(model, loader, device, max_batches, description, task=task)
    if labels is None:
        raise LinearizeError("the evaluation split has no labels")
    return compute_metrics(task, logits, labels)


def scores(model, loaders, spec, splits, progress=False):
    """The task's metrics on each of ``splits`` (with progress bars if ``progress``)."""
    return {split: evaluate(model, loaders[split], spec, description=f"  evaluating on {split}" if progress else None)
            for split in splits if split in loaders}
