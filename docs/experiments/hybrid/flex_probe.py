"""Can PyTorch's ``flex_attention`` build hybrid attention's exact part (issue 34, item 1: "measure, then choose")?

The hybrid's exact part (LoLCATs, Zhang et al. 2024, §3.2) is ``Σ_{j∈E_i} exp(s_ij − c_i)[v_j, 1]`` with ``c_i``
the largest exact score of the query: the linear part is added to it unscaled, so joining the two needs the
window's log-sum-exp *and* its max (``Σ exp(s − c) = exp(lse − c)``). ``flex_attention`` with a block mask
(BigBird's blocked window ∪ the first token) offers both through ``return_aux=AuxRequest(lse=True,
max_scores=True)``. This script asks it for them on this machine's device and reports what it answers:

1. compiled (``torch.compile(flex_attention)``, inference mode) with the log-sum-exp, and with the max too;
2. eager with the max;
3. eager with the log-sum-exp alone: its time and the process's peak memory before and after the call (a
   fresh child process per length, both kinds importing the same modules), against linearize's blocks (``hybrid_attention``, the chunked inference path) in the same way.

MiniLM's geometry (12 heads, head dim 32), batch 1, fp32, R = 64 + first, 2 threads.

With ``--device cuda`` (for a lent GPU; ``gpu_battery.sh flex``) it times instead, in bf16, the exact part by
compiled ``flex_attention`` (log-sum-exp and max) beside SDPA, pure linear attention and linearize's whole hybrid
layer, forward and forward + backward (medians of 20 calls): the exact part is what ``flex_attention`` would
replace, so its time against the hybrid's less the linear one's says whether it could pay.

    PYTHONPATH=. python docs/experiments/hybrid/flex_probe.py [--seq-lens 1024,4096] [--device cuda]
"""
import argparse
import json
import resource
import subprocess
import sys
import time

import torch

HEADS, DIM, RADIUS = 12, 32, 64


def window_or_first(b, h, q_index, k_index):
    """BigBird's blocked window (the query's block and its two neighbours) or the first token (the sink)."""
    return ((q_index // RADIUS - k_index // RADIUS).abs() <= 1) | (k_index == 0)


def flex_call(n, compiled, aux):
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention
    mask = create_block_mask(window_or_first, 1, 1, n, n, device="cpu", BLOCK_SIZE=RADIUS)
    q, k, v = (torch.randn(1, HEADS, n, DIM) for _ in range(3))
    attend = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention
    with torch.inference_mode():
        return attend(q, k, v, block_mask=mask, return_aux=AuxRequest(**aux))


def ask(label, n, compiled, aux):
    try:
        flex_call(n, compiled, aux)
        return {"case": label, "answer": "ran"}
    except Exception as error:  # the answer itself is the measurement
        lines = [line for line in str(error).splitlines() if "not supported" in line]
        return {"case": label, "answer": f"{type(error).__name__}: {(lines or [str(error)])[0].strip()}"}


def reference_error(n):
    """flex eager (log-sum-exp only) against the quadratic reference: the largest absolute differences."""
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, n, DIM) for _ in range(3))
    mask = create_block_mask(window_or_first, 1, 1, n, n, device="cpu", BLOCK_SIZE=RADIUS)
    with torch.inference_mode():
        out, aux = flex_attention(q, k, v, block_mask=mask, return_aux=AuxRequest(lse=True))
        index = torch.arange(n)
        scores = (q @ k.transpose(-1, -2) / DIM**0.5).masked_fill(
            ~window_or_first(0, 0, index[:, None], index[None]), float("-inf"))
        return (float((out - scores.softmax(-1) @ v).abs().max()),
                float((aux.lse - scores.logsumexp(-1)).abs().max()))


def child(kind, n):
    """One call, timed, in this (fresh) process: its wall time and the process's peak RSS after it."""
    torch.set_num_threads(2)
    torch.manual_seed(0)
    from torch.nn.attention import flex_attention  # noqa: F401  (both kinds import the same modules first)
    import linearize.attention.hybrid  # noqa: F401
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    if kind == "flex-eager-lse":
        start = time.perf_counter()
        flex_call(n, False, {"lse": True})
    else:
        from linearize.attention import create_feature_map
        from linearize.attention.hybrid import hybrid_attention
        fm = create_feature_map("hedgehog", DIM, HEADS)
        q, k, v = (torch.randn(1, HEADS, n, DIM) for _ in range(3))
        with torch.inference_mode():
            hybrid_attention(q, k, v, fm, RADIUS, ("first",), torch.full((HEADS,), 0.1))  # warm-up
            start = time.perf_counter()
            hybrid_attention(q, k, v, fm, RADIUS, ("first",), torch.full((HEADS,), 0.1))
    seconds = time.perf_counter() - start
    print(json.dumps({"kind": kind, "n": n, "ms": round(1000 * seconds, 1),
                      "rss_before_mib": before, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))


def device_times(lengths, device):
    """Median ms of forward and forward + backward per candidate (bf16 autocast, one layer) on ``device`` (a GPU;
    on a CPU the flex row reports its error): one JSON row each."""
    import statistics

    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    from linearize.attention import create_feature_map
    from linearize.attention.core import linear_attention
    from linearize.attention.hybrid import hybrid_attention
    fm = create_feature_map("hedgehog", DIM, HEADS).to(device)
    gamma = torch.full((HEADS,), 0.1, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    flex = torch.compile(flex_attention, dynamic=False)

    def timed(call, inputs, backward):
        def once():
            with torch.autocast(device, dtype=torch.bfloat16):
                out = call(*inputs)
            out = out[0] if isinstance(out, tuple) else out
            if backward:
                out.float().sum().backward()
        for _ in range(3):
            once()
        times = []
        for _ in range(20):
            sync()
            start = time.perf_counter()
            once()
            sync()
            times.append(1000 * (time.perf_counter() - start))
        return statistics.median(times)

    for n in lengths:
        mask = create_block_mask(window_or_first, 1, 1, n, n, device=device, BLOCK_SIZE=RADIUS)
        candidates = {
            "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
            "linear": lambda q, k, v: linear_attention(q, k, v, fm),
            "hybrid (blocks)": lambda q, k, v: hybrid_attention(q, k, v, fm, RADIUS, ("first",), gamma),
            "flex exact part": lambda q, k, v: flex(q, k, v, block_mask=mask,
                                                    return_aux=AuxRequest(lse=True, max_scores=True)),
        }
        for name, call in candidates.items():
            inputs = [torch.randn(1, HEADS, n, DIM, device=device, dtype=torch.bfloat16, requires_grad=True)
                      for _ in range(3)]
            try:
                with torch.inference_mode():
                    row = {"forward_ms": round(timed(call, [x.detach() for x in inputs], False), 3)}
                row["forward_backward_ms"] = round(timed(call, inputs, True), 3)
            except Exception as error:  # the answer is the measurement (the CPU refuses the flex row)
                row = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
            print(json.dumps({"n": n, "candidate": name, **row}), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-lens", default="1024,4096")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "N"))
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--times", action="store_true", help="the timing rows on a CPU too (a smoke run)")
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]))
    if args.device == "cuda" or args.times:
        return device_times([int(x) for x in args.seq_lens.split(",")], args.device)
    print(f"torch {torch.__version__}, device cpu, {torch.get_num_threads()} threads available")
    for row in (ask("compiled, lse", 512, True, {"lse": True}),
                ask("compiled, lse + max", 512, True, {"lse": True, "max_scores": True}),
                ask("eager, lse + max", 512, False, {"lse": True, "max_scores": True})):
        print(json.dumps(row))
    print(json.dumps({"case": "eager, lse: max abs error (output, lse) at 512", "answer": reference_error(512)}))
    for n in (int(x) for x in args.seq_lens.split(",")):
        for kind in ("flex-eager-lse", "linearize-blocks"):
            done = subprocess.run([sys.executable, __file__, "--child", kind, str(n)], capture_output=True, text=True,
                                  check=True)
            print(done.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
