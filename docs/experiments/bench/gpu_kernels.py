"""What one attention call costs on a GPU: kernels launched, their summed GPU time, and the wall time.

On an H100 in bf16 every linear layer below ~8k tokens took a flat 0.5-1.4 ms against SDPA's 0.13
(docs/experiments/bench/RESULTS.md#gpu): launches, not arithmetic, was the reading. This counts them:
per method and length, the call's kernels (``torch.profiler``, CUDA activity), the sum of their device
time, and the median wall time of the call; where the wall time is far above the kernels' sum, the
call is launch-bound (fusing kernels or CUDA graphs would pay), else its kernels are the cost. With
``--compile`` (the default on a GPU) each call is also timed through ``torch.compile(mode="reduce-overhead")``:
fused kernels replayed as a CUDA graph, what a user can do today (a compile failure is recorded, not fatal).

    python docs/experiments/bench/gpu_kernels.py --out runs/gpu-kernels            # on a GPU: CUDA kernels
    python docs/experiments/bench/gpu_kernels.py --device cpu --lens 512 --out /tmp/k   # the same code: aten ops

Writes ``kernels.json`` and ``kernels.md`` to ``--out``.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from linearize.attention import create_feature_map, linear_attention

METHODS = ("sdpa", "hedgehog", "t2r", "luna", "relu")


def attention_call(method, q, k, v):
    if method == "sdpa":
        return lambda: F.scaled_dot_product_attention(q, k, v)
    feature_map = create_feature_map(method, head_dim=q.shape[-1], num_heads=q.shape[1]).to(q.device).eval()
    return lambda: linear_attention(q, k, v, feature_map)


def wall_ms(call, device, repeats=20):
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def compiled_ms(method, q, k, v, device):
    """Median wall ms of the call compiled with CUDA graphs (``reduce-overhead``), or the error's first line."""
    try:
        torch._dynamo.reset()
        call = torch.compile(attention_call(method, q, k, v), mode="reduce-overhead")
        for _ in range(3):
            call()
        return wall_ms(call, device)
    except Exception as error:  # noqa: BLE001 - a measurement: the failure is the finding
        return str(error).strip().splitlines()[0][:160]


def kernels(call, device):
    """``(count, summed device ms)`` of one call: CUDA kernels on a GPU, aten ops (self CPU time) on the CPU."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        call()
        if device == "cuda":
            torch.cuda.synchronize()
    if device == "cuda":
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return len(events), sum(e.device_time for e in events) / 1000
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    return len(events), sum(e.self_cpu_time_total for e in events) / 1000


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--lens", default="512,4096,16384")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="also time torch.compile(mode='reduce-overhead') (default: on a GPU)")
    args = parser.parse_args(argv)
    args.compile = args.device == "cuda" if args.compile is None else args.compile
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    rows = []
    with torch.inference_mode():
        for n in (int(x) for x in args.lens.split(",")):
            q, k, v = (torch.randn(1, 12, n, 32, device=args.device, dtype=dtype) for _ in range(3))
            for method in METHODS:
                call = attention_call(method, q, k, v)
                for _ in range(3):
                    call()
                count, busy_ms = kernels(call, args.device)
                rows.append({"tokens": n, "method": method, "kernels": count, "kernel_ms": busy_ms,
                             "wall_ms": wall_ms(call, args.device),
                             "compiled_ms": compiled_ms(method, q, k, v, args.device) if args.compile else None})
                print(json.dumps(rows[-1]), flush=True)
    unit = "CUDA kernels" if args.device == "cuda" else "aten ops"
    lines = [f"{args.device} {args.dtype}, batch 1, 12 heads, head dim 32; {unit} of one call, their summed time, "
             "and the median wall time of 20 calls (compiled: through torch.compile, mode reduce-overhead)", "",
             f"| tokens | method | {unit} | their ms | wall ms | compiled wall ms |", "|---:|---|---:|---:|---:|---:|"]
    shown = lambda x: "—" if x is None else (f"{x:.3f}" if isinstance(x, float) else f"failed: {x}")  # noqa: E731
    lines += [f"| {r['tokens']:,} | {r['method']} | {r['kernels']} | {r['kernel_ms']:.3f} | {r['wall_ms']:.3f} "
              f"| {shown(r['compiled_ms'])} |" for r in rows]
    (args.out / "kernels.json").write_text(json.dumps({"device": args.device, "dtype": args.dtype, "rows": rows},
                                                      indent=1))
    (args.out / "kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
