"""One attention call on short inputs: the chunked inference path against the one-shot form, per method and shape.

MiniLM's geometry (12 heads of 32), ``torch.inference_mode()``, the two forms interleaved call by call; the median
of ``--calls`` calls each, ms. The chunked form is asked for with the default chunk passed explicitly
(``chunk_size=chunk_tokens(...)``), the one-shot form is what ``linear_attention`` takes at most
``ONE_SHOT_MAX_TOKENS`` tokens. A plain Python process (glibc's default allocator), as a user's.

    PYTHONPATH=. python docs/experiments/user-state/short_inputs.py --out docs/experiments/user-state/short-inputs.md
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from linearize.attention.core import ONE_SHOT_MAX_TOKENS, chunk_tokens, linear_attention
from linearize.attention.feature_maps import create_feature_map
from linearize.machine import machine_info
from linearize.outputs import atomic_write_text

HEADS, HEAD_DIM = 12, 32
METHODS = [("hedgehog", {}), ("t2r", {}), ("darkformer", {}), ("luna", {}),
           ("luna", {"projections": 16, "shared_projections": False})]
SHAPES = [(1, 8), (1, 16), (1, 32), (1, 64), (2, 32), (4, 16), (8, 8), (1, 128), (2, 64), (4, 32), (8, 16), (1, 256),
          (8, 128)]


def label(method, options):
    return method + ("(M=16 per head)" if options else "")


def times(calls_by_form, calls):
    """Medians (ms) of ``calls`` interleaved calls of each form, after 5 untimed rounds."""
    taken = {form: [] for form in calls_by_form}
    with torch.inference_mode():
        for round_ in range(calls + 5):
            for form, call in calls_by_form.items():
                start = time.perf_counter()
                call()
                if round_ >= 5:
                    taken[form].append(time.perf_counter() - start)
    return {form: 1000 * statistics.median(values) for form, values in taken.items()}


def row(method, options, batch, seq, calls):
    # made outside inference mode, as transformers' from_pretrained makes a model's parameters (inference
    # tensors have no version counter, so a map's cached tables would be rebuilt on every call)
    fm = create_feature_map(method, HEAD_DIM, HEADS, **options).eval()
    q, k, v = (torch.randn(batch, seq, HEADS * HEAD_DIM).view(batch, seq, HEADS, HEAD_DIM).transpose(1, 2)
               for _ in range(3))
    chunk = chunk_tokens(batch * HEADS, fm.feature_dim, None)
    forms = {"chunked": lambda: linear_attention(q, k, v, fm, chunk_size=chunk),
             "one-shot": lambda: linear_attention(q, k, v, fm, chunk_size=None) if batch * seq <= ONE_SHOT_MAX_TOKENS
             else _one_shot(q, k, v, fm),
             "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)}
    return times(forms, calls)


def _one_shot(q, k, v, fm):
    """The one-shot form above the threshold (the map told it cannot chunk), for the rows past it."""
    fm.chunkable = False
    try:
        return linear_attention(q, k, v, fm)
    finally:
        fm.chunkable = True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lines = ["| batch × tokens | " + " | ".join(label(m, o) for m, o in METHODS) + " | SDPA |",
             "|:--|" + "--:|" * (len(METHODS) + 1)]
    for batch, seq in SHAPES:
        cells, sdpa = [], []
        for method, options in METHODS:
            measured = row(method, options, batch, seq, args.calls)
            cells.append(f"{measured['chunked']:.2f} / {measured['one-shot']:.2f}")
            sdpa.append(measured["sdpa"])
        lines.append(f"| {batch} × {seq} | " + " | ".join(cells) + f" | {statistics.median(sdpa):.2f} |")
        print(lines[-1], flush=True)
    machine = machine_info()
    text = (f"# One attention call on short inputs: chunked / one-shot (ms)\n\n{machine.get('cpu_model', '')}, "
            f"{args.threads} threads, torch {torch.__version__}, medians of {args.calls} interleaved calls; "
            f"the one-shot form is the default at most {ONE_SHOT_MAX_TOKENS} tokens (batch × length).\n\n"
            + "\n".join(lines) + "\n")
    atomic_write_text(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
