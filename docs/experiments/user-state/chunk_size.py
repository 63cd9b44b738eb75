"""One attention layer's inference time against its chunk size (issue 35): which chunk the default should be.

Times ``core.linear_attention`` (pure) and ``hybrid_chunked.chunked_hybrid_attention`` (R = 32, the first
token a sink) at MiniLM's geometry (12 heads of 32) on the same q, k, v (``[B, H, N, d]`` views of
``[B, N, H, d]`` tensors, as BERT passes them), under ``torch.inference_mode``, every chunk size of a
configuration interleaved call by call; the median of ``--calls`` calls each. The default chunk
(``core.chunk_tokens``) is marked with ``*``.

    PYTHONPATH=. python docs/experiments/user-state/chunk_size.py --out docs/experiments/user-state/chunk-size.md
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from linearize.attention.core import chunk_tokens, linear_attention
from linearize.attention.feature_maps import create_feature_map
from linearize.attention.hybrid import parse_sinks, sink_positions
from linearize.attention.hybrid_chunked import chunked_hybrid_attention
from linearize.machine import machine_info

METHODS = {"hedgehog": {}, "t2r": {}, "darkformer": {}, "luna": {},
           "luna-recipe": {"projections": 16, "shared_projections": False}}
SHAPES = ((8, 128), (8, 512), (1, 1024), (1, 4096), (1, 8192))  # (batch, tokens)
HEADS, HEAD_DIM, RADIUS = 12, 32, 32


def time_chunks(call, chunks, calls):
    """``{chunk: median seconds}`` of ``call(chunk)``, the chunk sizes interleaved call by call."""
    times = {chunk: [] for chunk in chunks}
    for round_ in range(calls + 1):
        for chunk in chunks:
            start = time.perf_counter()
            call(chunk)
            if round_:  # the first round warms up
                times[chunk].append(time.perf_counter() - start)
    return {chunk: statistics.median(values) for chunk, values in times.items()}


def candidates(default, seq):
    """Powers of two from a quarter of the default to four times it, capped at the sequence."""
    sizes = {min(seq, max(32, default << shift >> 2)) for shift in range(5)}
    return sorted(sizes | {min(default, seq)})


def row(method, options, batch, seq, hybrid, calls):
    q, k, v = (torch.randn(batch, seq, HEADS * HEAD_DIM).view(batch, seq, HEADS, HEAD_DIM).transpose(1, 2)
               for _ in range(3))
    fm = create_feature_map("luna" if method.startswith("luna") else method, HEAD_DIM, HEADS, **options).eval()
    default = chunk_tokens(batch * HEADS, fm.feature_dim, None)
    if hybrid:
        fm.make_hybrid(RADIUS, "first")
        sinks, gamma = sink_positions(None, batch, seq, parse_sinks("first"), q.device), fm.hybrid_gamma().detach()
        call = lambda chunk: chunked_hybrid_attention(q, k, v, fm, RADIUS, sinks, gamma, None, None, 1e-6, chunk)  # noqa: E731
    else:
        call = lambda chunk: linear_attention(q, k, v, fm, chunk_size=chunk)  # noqa: E731
    with torch.inference_mode():
        times = time_chunks(call, candidates(default, seq), calls)
    best = min(times, key=times.get)
    cells = " ".join(f"{chunk}{'*' if chunk == min(default, seq) else ''}: {1e3 * t:.2f}" for chunk, t in times.items())
    slower = times[min(default, seq)] / times[best] - 1
    return f"| {method}{' R=32+first' if hybrid else ''} | {batch} × {seq} | {cells} | {best} | {100 * slower:.0f}% |"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the table here too (markdown)")
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info()
    lines = [f"Machine: {info['cpu_model']}, {args.threads} threads, torch {torch.__version__}, fp32. "
             f"Milliseconds per call (median of {args.calls}) by chunk size in tokens; * the default.", "",
             "| layer | batch × tokens | ms by chunk | best | default slower by |", "|:--|:--|:--|--:|--:|"]
    print("\n".join(lines), flush=True)
    for method in args.methods.split(","):
        for hybrid in (False, True):
            for batch, seq in SHAPES:
                if hybrid and (seq <= 2 * RADIUS or method not in ("hedgehog", "luna-recipe")):
                    continue
                lines.append(row(method, METHODS[method], batch, seq, hybrid, args.calls))
                print(lines[-1], flush=True)
    if args.out is not None:
        from linearize.outputs import atomic_write_text
        atomic_write_text(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
