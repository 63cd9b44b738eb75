"""Where the hybrid window's time goes in the whole recipe LUNA model (a diagnosis, not a user-state figure):
two folders converted from all-MiniLM-L6-v2 (random LUNA parameters, per head, M = 16, positions to 4,096), one
pure and one with the window (R = 32 + first, layers 1-2), loaded with plain transformers in one process, 2 threads;
four interleaved timings each, then one forward each under torch.profiler, self CPU time by op.

    linearize convert $MINILM --method luna -o projections=16 -o shared_projections=false --max-length 4096 \
        --out /tmp/prof/pure
    linearize convert $MINILM --method luna -o projections=16 -o shared_projections=false --max-length 4096 \
        --window 32 --sinks first --hybrid-layers 1,2 --out /tmp/prof/hybrid
    .venv/bin/python docs/experiments/levers/profile_hybrid.py 4096
"""
import sys, time, statistics, torch
from transformers import AutoModel
from torch.profiler import profile, ProfilerActivity
torch.set_num_threads(2)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
models = {n: AutoModel.from_pretrained(f"/tmp/prof/{n}", trust_remote_code=True).eval() for n in ("pure", "hybrid")}
ids = torch.randint(1000, 20000, (1, N)); mask = torch.ones_like(ids)
times = {n: [] for n in models}
with torch.inference_mode():
    for n, m in models.items():
        m(input_ids=ids, attention_mask=mask)
    for _ in range(4):
        for n, m in models.items():
            t = time.perf_counter(); m(input_ids=ids, attention_mask=mask); times[n].append(time.perf_counter() - t)
    for n in models:
        print(n, "median ms", round(1000 * statistics.median(times[n]), 1), [round(1000 * x) for x in times[n]])
    for n, m in models.items():
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as p:
            m(input_ids=ids, attention_mask=mask)
        print("=====", n)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=40))
