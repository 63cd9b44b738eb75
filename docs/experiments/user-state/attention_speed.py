"""One attention layer, the saved remote code of two sets of folders side by side (issue 35).

Loads ``modeling_linearize.py`` of ``<before>/<method>`` and ``<after>/<method>`` as two modules in
one process (neither needs linearize), builds each method's feature map from both with the same
weights, and times ``linear_attention`` on the same q, k, v (``[B, H, N, d]`` views of
``[B, N, H, d]`` tensors, as BERT passes them) under ``torch.inference_mode``, the two versions
interleaved call by call; per configuration the fastest of ``--calls`` calls of each (the least
disturbed by other load on a shared machine) and their ratio.

    .venv/bin/python docs/experiments/user-state/attention_speed.py /tmp/uf-before /tmp/uf-after
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

CASES = {"hedgehog": {}, "t2r": {}, "darkformer": {}, "luna": {},
         "luna-recipe": {"projections": 16, "shared_projections": False}}
SHAPES = ((8, 128), (8, 512), (1, 4096))  # (batch, tokens)


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module


def fastest(fn, calls):
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    sys.modules["linearize"] = None
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    for method, options in CASES.items():
        versions = [load(folder / method / "modeling_linearize.py", f"v{index}_{method.replace('-', '_')}")
                    for index, folder in enumerate((args.before, args.after))]
        name = "luna" if method.startswith("luna") else method
        maps = [version.create_feature_map(name, 32, 12, **options).eval() for version in versions]
        maps[1].load_state_dict(maps[0].state_dict())
        for batch, tokens in SHAPES:
            q, k, v = (t.transpose(1, 2) for t in torch.randn(3, batch, tokens, 12, 32))
            with torch.inference_mode():
                calls = [lambda version=version, fm=fm: version.linear_attention(q, k, v, fm)
                         for version, fm in zip(versions, maps)]
                outs = [call() for call in calls]
                times = [float("inf"), float("inf")]
                for _ in range(args.calls):
                    for index, call in enumerate(calls):
                        times[index] = min(times[index], fastest(call, 1))
            rows.append({"method": method, "batch": batch, "tokens": tokens, "before_ms": round(1e3 * times[0], 2),
                         "after_ms": round(1e3 * times[1], 2), "after/before": round(times[1] / times[0], 3),
                         "max_abs_diff": float((outs[0] - outs[1]).abs().max())})
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
