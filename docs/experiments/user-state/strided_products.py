"""What reading one sequence's rows in place saves (``core.features_of_chunk`` and the key state, batch 1): the
``[H, N, d]`` rows of a ``[1, N, H, d]`` projection output are a strided view, and a batched product reads them
as they are. Per product, MiniLM geometry (12 heads of 32, 64 features), 2 threads, ``torch.inference_mode()``,
the four calls interleaved in alternating order, medians of 100 rounds, µs:

- the first product of a map that folds the input scale (Hedgehog): scale-and-copy then product, or the product
  on the view;
- the key state ``Σ φ(k_j) v_jᵀ``: copy then product, or the product on the view.

    python docs/experiments/user-state/strided_products.py 900 2048 4096
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

HEADS, HEAD_DIM, FEATURES = 12, 32, 64


def medians(n, rounds=100):
    view = torch.randn(1, n, HEADS, HEAD_DIM).transpose(1, 2)  # [1, H, N, d], as BERT passes it
    weight, features = torch.randn(HEADS, HEAD_DIM, FEATURES), torch.rand(HEADS, n, FEATURES)
    copy, out, state = torch.empty(HEADS, 1, n, HEAD_DIM), torch.empty(HEADS, n, FEATURES), \
        torch.empty(HEADS, FEATURES, HEAD_DIM)
    calls = {
        "features: copy, product": lambda: (torch.mul(view.transpose(0, 1), 0.42, out=copy),
                                            torch.bmm(copy.view(HEADS, n, HEAD_DIM), weight, out=out)),
        "features: on the view": lambda: torch.bmm(view[0], weight, out=out),
        "state: copy, product": lambda: (copy.copy_(view.transpose(0, 1)),
                                         torch.bmm(features.transpose(1, 2), copy.view(HEADS, n, HEAD_DIM), out=state)),
        "state: on the view": lambda: torch.bmm(features.transpose(1, 2), view[0], out=state)}
    times = {name: [] for name in calls}
    with torch.inference_mode():
        for call in calls.values():
            call()
        for index in range(rounds):
            for name in (list(calls) if index % 2 == 0 else list(calls)[::-1]):
                start = time.perf_counter()
                calls[name]()
                times[name].append(1e6 * (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in times.items()}


if __name__ == "__main__":
    torch.set_num_threads(2)
    print("| N | " + " | ".join(["features: copy, product", "features: on the view", "state: copy, product",
                                 "state: on the view"]) + " |\n|--:|--:|--:|--:|--:|")
    for n in (int(arg) for arg in sys.argv[1:] or ["900", "2048", "4096"]):
        print(f"| {n:,} | " + " | ".join(f"{value:.0f}" for value in medians(n).values()) + " |", flush=True)
