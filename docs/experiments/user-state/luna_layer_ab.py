"""One LUNA attention layer (defaults, and the recipe's M = 16 per head) at 8 × 128, 8 × 512 and 1 × 4,096 tokens:
the median ms of ``linear_attention`` over 15 calls after 3 warm-ups, MiniLM's geometry (12 heads of 32), random
q, k, v (seed 0). Run once per build, alternating, the "before" build from a worktree on ``PYTHONPATH``; each run
saves its outputs to /tmp/prof/out-<label>-*.pt so the two builds' outputs can be compared (issue 35).

    git worktree add /tmp/before-wt <commit>
    for i in 1 2; do PYTHONPATH=/tmp/before-wt .venv/bin/python docs/experiments/user-state/luna_layer_ab.py 2 before
        .venv/bin/python docs/experiments/user-state/luna_layer_ab.py 2 after; done
"""
import os
import sys, time, torch
from linearize.attention.feature_maps import create_feature_map
from linearize.attention.core import linear_attention
torch.set_num_threads(int(sys.argv[1]))
torch.manual_seed(0)
res = {}
for name, opts in (("luna", {}), ("luna-recipe", {"projections": 16, "shared_projections": False})):
    fm = create_feature_map("luna", 32, 12, **opts).eval()
    for B, N in ((8, 128), (8, 512), (1, 4096)):
        q, k, v = (t.transpose(1, 2) for t in torch.randn(3, B, N, 12, 32))
        with torch.inference_mode():
            for _ in range(3): linear_attention(q, k, v, fm)
            ts = []
            for _ in range(15):
                t = time.perf_counter(); out = linear_attention(q, k, v, fm); ts.append(time.perf_counter() - t)
        ts.sort(); res[f"{name} {B}x{N}"] = round(1e3 * ts[7], 2)
        os.makedirs("/tmp/prof", exist_ok=True); torch.save(out, f"/tmp/prof/out-{sys.argv[2]}-{name}-{B}x{N}.pt")
print(sys.argv[2], res)
