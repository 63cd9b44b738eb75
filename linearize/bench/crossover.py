"""Where a linear method becomes faster than softmax: the crossover length, measured and
interpolated, and the line that states it."""

from __future__ import annotations

import math

from .methods import SDPA

#: how the crossover is computed (:func:`crossover_point`), stated in every whole-model output
CROSSOVER_RULE = ("the smallest measured N from which the converted model is faster than softmax at every longer "
                  "measured N; the interpolated N is where the time ratio crosses 1 when log(ratio) is taken as "
                  "linear in log N between the last slower and the first faster measured length")


def crossover_point(points):
    """Where a method becomes faster than softmax, from ``[(N, time ÷ softmax time)]`` (any order).

    - ``measured``: the smallest measured N from which the method is faster (ratio < 1) at that
      and every longer measured N; for a ratio that falls with N (the usual case) this is the
      smallest measured N where it is faster. A faster point followed by a slower one (noise) is
      not a crossover. None: not faster at the longest measured N.
    - ``estimate``: the N where the ratio crosses 1 between the last slower measured point
      ``(N0, r0)`` (r0 ≥ 1) and ``measured`` ``(N1, r1)``, by linear interpolation of log r in
      log N: ``log N* = log N0 + t·(log N1 - log N0)`` with ``t = log r0 / (log r0 - log r1)``
      (rounded to a whole N). None when never faster or faster already at the first measured N.
    """
    points = sorted((int(n), float(r)) for n, r in points)
    if not points:
        return None
    measured = None
    for index, (n, ratio) in enumerate(points):
        if all(r < 1.0 for _, r in points[index:]):
            measured = n
            break
    estimate = None
    if measured is not None and measured != points[0][0]:
        index = [n for n, _ in points].index(measured)
        (n0, r0), (n1, r1) = points[index - 1], points[index]
        if r0 >= 1.0 > r1 and r1 > 0:
            t = math.log(r0) / (math.log(r0) - math.log(r1))
            estimate = round(math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0))))
    note = ("never faster in the measured range" if measured is None else
            f"faster from the first measured length ({measured}) on" if measured == points[0][0] else
            f"faster from N={measured} on")
    return {"measured": measured, "estimate": estimate, "faster_at_all_lengths": measured == points[0][0],
            "note": note}


def crossover_text(cross, unit="softmax"):
    """One line: where a method is faster than ``unit`` (from a :func:`crossover_point` dict)."""
    if not cross or cross.get("measured") is None:
        return f"not faster than {unit} at the longest measured length"
    if cross.get("faster_at_all_lengths"):
        return f"faster than {unit} at every measured length (from N = {cross['measured']:,})"
    estimate = f" (interpolated crossover N ≈ {cross['estimate']:,})" if cross.get("estimate") else ""
    return f"faster than {unit} from N = {cross['measured']:,} on{estimate}"


def crossovers(rows, labels, reference=SDPA):
    """Per label: :func:`crossover_point` of its time ÷ ``reference``'s time over the rows where
    both were measured (``measured``: the first length from which it stays faster; ``estimate``:
    the log-log interpolated N where the ratio crosses 1)."""
    out = {}
    for label in labels:
        points = [(row["seq_len"], row["results"][label]["median_ms"] / row["results"][reference]["median_ms"])
                  for row in rows if label in row["results"] and reference in row["results"]]
        if points:
            out[label] = crossover_point(points)
    return out
