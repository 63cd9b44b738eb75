"""One hybrid attention layer's inference path (``hybrid_chunked``) at an earlier commit against the working
tree's, side by side in one process, with pure linear attention and SDPA beside them.

MiniLM geometry (12 heads of 32), ``[B, H, N, d]`` views of ``[B, N, H, d]`` tensors as BERT passes them, sinks
``first``, ``torch.inference_mode()``, the four calls interleaved; the median of ``--calls`` rounds, ms. The
earlier module is read with ``git show`` (its relative imports made absolute), so both run on today's ``core``.

    PYTHONPATH=. python docs/experiments/hybrid/chunked_before_after.py --before 58bd91e
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from linearize.attention.core import linear_attention
from linearize.attention.feature_maps import create_feature_map
from linearize.attention.hybrid import parse_sinks, sink_positions
from linearize.attention.hybrid_chunked import chunked_hybrid_attention
from linearize.machine import machine_info

HEADS, HEAD_DIM = 12, 32
ROWS = [("hedgehog", {}, 32, 1, 300), ("hedgehog", {}, 32, 1, 900)] + \
    [("hedgehog", {}, 16, 1, 2048), ("hedgehog", {}, 16, 1, 4096)] + \
    [("hedgehog", {}, 32, b, n) for b, n in ((8, 512), (1, 1024), (1, 2048), (1, 4096), (1, 8192))] + \
    [("hedgehog", {}, 64, 1, 2048), ("hedgehog", {}, 64, 1, 4096)] + \
    [("luna", {"projections": 16, "shared_projections": False}, 32, b, n) for b, n in ((1, 1024), (1, 2048), (1, 4096))]


def earlier_module(commit):
    """``hybrid_chunked`` as it was at ``commit``, imported from a temporary file."""
    source = subprocess.run(["git", "show", f"{commit}:linearize/attention/hybrid_chunked.py"], check=True,
                            capture_output=True, text=True).stdout
    source = source.replace("from .core import", "from linearize.attention.core import")
    folder = Path(tempfile.mkdtemp())
    (folder / "hybrid_chunked_before.py").write_text(source)
    sys.path.insert(0, str(folder))
    import hybrid_chunked_before

    return hybrid_chunked_before


def row(before, method, options, radius, batch, seq, calls):
    q, k, v = (torch.randn(batch, seq, HEADS * HEAD_DIM).view(batch, seq, HEADS, HEAD_DIM).transpose(1, 2)
               for _ in range(3))
    pure_map = create_feature_map(method, HEAD_DIM, HEADS, **options).eval()
    fm = create_feature_map(method, HEAD_DIM, HEADS, **options).eval()
    fm.make_hybrid(radius, "first")
    sinks, gamma = sink_positions(None, batch, seq, parse_sinks("first"), q.device), fm.hybrid_gamma().detach()
    paths = {"before": lambda: before.chunked_hybrid_attention(q, k, v, fm, radius, sinks, gamma, None, None, 1e-6),
             "after": lambda: chunked_hybrid_attention(q, k, v, fm, radius, sinks, gamma, None, None, 1e-6),
             "linear": lambda: linear_attention(q, k, v, pure_map),
             "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)}
    times = {name: [] for name in paths}
    with torch.inference_mode():
        old, new = paths["before"](), paths["after"]()
        error = ((old - new).abs().max() / old.abs().max()).item()
        for round_ in range(calls + 1):
            for name, call in paths.items():
                start = time.perf_counter()
                call()
                if round_:
                    times[name].append(time.perf_counter() - start)
    ms = {name: 1e3 * statistics.median(values) for name, values in times.items()}
    return (f"| {method}{' (M = 16, per head)' if options else ''} | {radius} | {batch} × {seq:,} | {ms['before']:.2f} | "
            f"{ms['after']:.2f} | {ms['before'] / ms['after']:.2f}× | {ms['linear']:.2f} | {ms['sdpa']:.2f} | {error:.0e} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit whose hybrid_chunked is the 'before'")
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    before = earlier_module(args.before)
    print(f"Machine: {machine_info()['cpu_model']}, {args.threads} threads, torch {torch.__version__}, fp32; "
          f"ms per call, medians of {args.calls} interleaved rounds; before = {args.before}.\n")
    print("| map | R | B × N | before | after | faster by | pure linear | SDPA | max rel. difference |")
    print("|:--|--:|:--|--:|--:|--:|--:|--:|--:|")
    for method, options, radius, batch, seq in ROWS:
        print(row(before, method, options, radius, batch, seq, args.calls), flush=True)


if __name__ == "__main__":
    main()
