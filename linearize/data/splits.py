"""Deterministic, stratified held-out splits (a test split, or a dev split carved from train).

Model selection must never see the test split, so a dev split is always carved out of
*train*, and carving it does not change which examples are in the test split. The random
streams are NumPy ``default_rng([stream, seed])``: the test draw (stream 0) and the dev
draw (stream 1) are independent, and the same seed gives the same split on every machine.
"""

from __future__ import annotations

import numpy as np

from ..errors import LinearizeError

TEST_STREAM = 0
DEV_STREAM = 1


def check_fraction(fraction, what="dev_fraction"):
    fraction = float(fraction)
    if not 0.0 <= fraction < 1.0:
        raise LinearizeError(f"{what} must be in [0, 1), got {fraction}; e.g. 0.1 holds out a tenth")
    return fraction


def split_indices(labels, fraction, seed=0, stream=DEV_STREAM, stratify=True):
    """``(kept, held)``: sorted index arrays, ``held`` ≈ ``fraction`` of each class.

    ``stratify=False`` (regression labels) draws from all examples at once. With a positive
    fraction at least one example is held out, so a tiny data set still gets a dev split.
    """
    fraction = check_fraction(fraction)
    labels = np.asarray(labels)
    n = len(labels)
    rng = np.random.default_rng([stream, int(seed)])
    groups = [np.flatnonzero(labels == c) for c in np.unique(labels)] if stratify else [np.arange(n)]
    held = []
    for group in groups:
        order = rng.permutation(group)
        held.extend(order[: int(round(len(group) * fraction))].tolist())
    if fraction > 0 and not held and n > 1:
        largest = max(groups, key=len)
        held.append(int(rng.choice(largest)))
    held = np.sort(np.asarray(held, dtype=np.int64))
    kept = np.setdiff1d(np.arange(n, dtype=np.int64), held)
    return kept, held


def carve_dev_split(data, fraction, seed=0, label_column="label", stratify=None):
    """Return a new ``DatasetDict`` whose ``validation`` is ``fraction`` of ``train``.

    Existing ``validation*`` splits become ``test*`` (``validation_mismatched`` →
    ``test_mismatched``): once a dev split is carved for model selection, the old
    validation data is only reported, never used to choose. ``fraction == 0`` returns
    ``data`` unchanged. ``stratify`` defaults to "labels are integers".
    """
    from datasets import DatasetDict

    fraction = check_fraction(fraction)
    if fraction == 0:
        return data
    if "train" not in data:
        raise LinearizeError(f"cannot carve a dev split: no 'train' split (splits: {', '.join(data)})")
    renamed = {}
    for name in data:
        if name.startswith("validation"):
            target = "test" + name[len("validation"):]
            if target in data:
                raise LinearizeError(f"cannot carve a dev split: the data already has {name!r} and {target!r}; "
                                     "pass dev_fraction=0 to use its own validation split")
            renamed[name] = target
    train = data["train"]
    labels = train[label_column]
    if stratify is None:
        stratify = all(isinstance(v, (int, np.integer)) for v in labels[:1000])
    kept, held = split_indices(labels, fraction, seed=seed, stream=DEV_STREAM, stratify=stratify)
    out = {"train": train.select(kept), "validation": train.select(held)}
    for name, split in data.items():
        if name != "train":
            out[renamed.get(name, name)] = split
    return DatasetDict(out)
