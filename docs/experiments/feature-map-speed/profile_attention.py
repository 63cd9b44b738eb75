"""Where a method's attention time goes: torch.profiler over the converted all-MiniLM-L6-v2.

Run from the repository root:
    OMP_NUM_THREADS=1 python docs/experiments/feature-map-speed/profile_attention.py --seq-len 128
Prints, per method, the whole-model time and the top ATen ops (self CPU time) of the forward.
"""

import argparse
import copy

import torch
from torch.profiler import ProfilerActivity, profile

from linearize.bench import load_model, model_inputs, recipe_luna
from linearize.convert import convert

METHODS = {"luna": ("luna", {}), "recipe-luna": recipe_luna(), "hedgehog": ("hedgehog", {}),
           "t2r": ("t2r", {}), "darkformer": ("darkformer", {})}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--rows", type=int, default=14)
    args = parser.parse_args()
    base = load_model("minilm").eval()
    batch = model_inputs(base, args.batch_size, args.seq_len, 0)
    models = {"softmax (sdpa)": base}
    for label in args.methods.split(","):
        name, options = METHODS[label]
        torch.manual_seed(0)
        models[label] = convert(copy.deepcopy(base), name, **options).eval()
    with torch.inference_mode():
        for label, model in models.items():
            for _ in range(2):
                model(**batch)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    model(**batch)
            events = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in events) / 3 / 1e3
            print(f"\n=== {label}  N={args.seq_len} batch={args.batch_size}: {total:.1f} ms per forward (profiled)")
            for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.rows]:
                print(f"  {e.key:40s} {e.self_cpu_time_total / 3 / 1e3:8.2f} ms  calls {e.count // 3:4d}")


if __name__ == "__main__":
    main()
