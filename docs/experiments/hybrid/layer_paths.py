"""Per-layer time of hybrid attention's two paths (the one-shot path that training and traced graphs take, and
the chunked inference path a user's forward takes) beside SDPA and pure linear attention: MiniLM geometry (12
heads, head dim 32), Hedgehog (64 features), sinks first, batch 1, fp32, 2 threads, torch.inference_mode();
medians of 11 rounds, candidates interleaved in alternating order, one process.

    PYTHONPATH=. python docs/experiments/hybrid/layer_paths.py [--seq-lens 2048,4096,8192] [--radii 16,32,64]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from linearize.attention import create_feature_map
from linearize.attention.core import linear_attention
from linearize.attention.hybrid import hybrid_attention


def one_shot(q, k, v, fm, radius, gamma):
    """The one-shot path: the dispatcher takes it for a map that is not chunkable."""
    fm.chunkable = False
    try:
        return hybrid_attention(q, k, v, fm, radius, ("first",), gamma)
    finally:
        fm.chunkable = True


def medians(candidates, rounds=11):
    for run in candidates.values():
        run()
    times = {name: [] for name in candidates}
    for index in range(rounds):
        for name in (list(candidates) if index % 2 == 0 else list(candidates)[::-1]):
            start = time.perf_counter()
            candidates[name]()
            times[name].append(1000 * (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in times.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-lens", default="2048,4096,8192")
    parser.add_argument("--radii", default="16,32,64")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    fm = create_feature_map("hedgehog", 32, 12)
    gamma = torch.full((12,), 0.1)
    print("| N | R | SDPA | linear | hybrid, one-shot | hybrid, chunked | chunked ÷ linear | one-shot ÷ chunked |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|")
    with torch.inference_mode():
        for n in (int(x) for x in args.seq_lens.split(",")):
            q, k, v = (torch.randn(1, 12, n, 32) for _ in range(3))
            for radius in (int(x) for x in args.radii.split(",")):
                m = medians({
                    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
                    "linear": lambda: linear_attention(q, k, v, fm),
                    "one-shot": lambda: one_shot(q, k, v, fm, radius, gamma),
                    "chunked": lambda: hybrid_attention(q, k, v, fm, radius, ("first",), gamma),
                })
                print(f"| {n:,} | {radius} | {m['sdpa']:.1f} | {m['linear']:.1f} | {m['one-shot']:.1f} | "
                      f"{m['chunked']:.1f} | {m['chunked'] / m['linear']:.2f} | {m['one-shot'] / m['chunked']:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
