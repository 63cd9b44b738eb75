"""Peak extra memory of one MiniLM-geometry layer's stage-1 step (loss + backward), one shot vs
block by block of query rows, and the two losses at N = 512 (issue 19, item 4).

One layer of all-MiniLM-L6-v2's geometry (12 heads, head dim 32), batch 1, random q/k/v, the
feature map of ``--method`` with its default options. Each measurement is exactly what stage 1
does per layer: ``DistillRecorder`` (train mode) forms the teacher and student rows, computes the
cross-entropy and back-propagates it into the feature map, and returns the exact softmax output.
Peak memory: ``linearize.bench.peak_extra_memory`` (torch.profiler's CPU allocation events; the
inputs and the map's weights, allocated before, are not counted).

    PYTHONPATH=. OMP_NUM_THREADS=1 python docs/experiments/long-stage1/measure.py \
        --out docs/experiments/long-stage1/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from linearize.attention import create_feature_map
from linearize.bench import peak_extra_memory
from linearize.distill import DistillRecorder
from linearize.distill.blockwise import rows_per_block

HEADS, HEAD_DIM = 12, 32


def layer_inputs(n, seed=0, pad=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, generator=g) for _ in range(3))
    mask = torch.ones(1, n)
    if pad:
        mask[0, n - pad:] = 0
    return q, k, v, mask


def stage1_step(fm, inputs, block_size):
    """One layer's stage-1 loss + backward as training runs it; returns ``(ce, feature-map grads)``."""
    fm.zero_grad(set_to_none=True)
    recorder = DistillRecorder(train=True, block_size=block_size)
    q, k, v, mask = inputs
    recorder(fm, q, k, v, mask, None, False)
    grads = [p.grad.clone() for p in fm.parameters() if p.grad is not None]
    return recorder.per_layer()[fm.layer_index]["ce"], grads


def equality(fm, n, block_size):
    inputs = layer_inputs(n, seed=1, pad=n // 7)
    ce_one, grads_one = stage1_step(fm, inputs, 0)
    ce_block, grads_block = stage1_step(fm, inputs, block_size)
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(grads_one, grads_block))
    return {"n": n, "block_size": block_size, "ce_one_shot": ce_one, "ce_blockwise": ce_block,
            "abs_difference": abs(ce_one - ce_block), "max_grad_difference": grad_diff}


def memory(fm, lengths, block_size):
    rows = []
    for n in lengths:
        inputs = layer_inputs(n)
        rows_each = rows_per_block(1, HEADS, n, block_size)  # block_size, or fewer under the element cap
        for label, block in (("one shot", 0), (f"blocks of {rows_each}", block_size)):
            start = time.perf_counter()
            peak = peak_extra_memory(lambda: stage1_step(fm, inputs, block))
            rows.append({"n": n, "path": label, "block_size": block, "rows_per_block": rows_each if block else n,
                         "peak_extra_bytes": peak,
                         "seconds": time.perf_counter() - start})
            print(f"N={n:5d} {label:14s} peak {peak / 2**20:8.1f} MiB  ({rows[-1]['seconds']:.1f} s)", flush=True)
    return rows


def table(rows):
    lines = ["| N | path | peak extra MiB | per token (KiB) | per N² (B) |", "|--:|:--|--:|--:|--:|"]
    for row in rows:
        n, peak = row["n"], row["peak_extra_bytes"]
        lines.append(f"| {n} | {row['path']} | {peak / 2**20:.1f} | {peak / n / 1024:.1f} | {peak / n / n:.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="hedgehog")
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--lengths", default="1024,2048,4096")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    fm = create_feature_map(args.method, HEAD_DIM, HEADS)
    fm.layer_index = 0
    checks = [equality(fm, 512, block) for block in (128, 100)]
    for check in checks:
        print(f"N=512 blocks of {check['block_size']}: CE one shot {check['ce_one_shot']:.7f}, blockwise "
              f"{check['ce_blockwise']:.7f}, |diff| {check['abs_difference']:.1e}, "
              f"max |grad diff| {check['max_grad_difference']:.1e}")
    rows = memory(fm, [int(n) for n in args.lengths.split(",")], args.block_size)
    print(table(rows))
    if args.out:
        result = {"method": args.method, "heads": HEADS, "head_dim": HEAD_DIM, "batch": 1,
                  "threads": torch.get_num_threads(), "torch": torch.__version__, "equality": checks, "memory": rows}
        tmp = f"{args.out}.tmp"
        with open(tmp, "w") as handle:
            json.dump(result, handle, indent=1)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
