"""One attention layer (MiniLM geometry) per method: median time against SDPA and the profile of
its ATen ops. Run from the repository root:
    OMP_NUM_THREADS=1 python docs/experiments/feature-map-speed/profile_layer.py --seq-len 128
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from linearize.attention.feature_maps import create_feature_map
from linearize.bench import recipe_luna

METHODS = {"luna": ("luna", {}), "recipe-luna": recipe_luna(), "hedgehog": ("hedgehog", {}),
           "t2r": ("t2r", {}), "darkformer": ("darkformer", {})}


def median_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--padded", action="store_true", help="pad the last quarter of every second sequence")
    args = parser.parse_args()
    torch.manual_seed(0)
    q, k, v = (torch.randn(args.batch_size, 12, args.seq_len, 32) for _ in range(3))
    mask = None
    if args.padded:
        mask = torch.ones(args.batch_size, args.seq_len, dtype=torch.bool)
        mask[::2, -args.seq_len // 4:] = False
    candidates = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v)}
    for label in args.methods.split(","):
        name, options = METHODS[label]
        torch.manual_seed(0)
        fm = create_feature_map(name, 32, 12, **options).eval()
        candidates[label] = (lambda fm: lambda: fm.attend(q, k, v, mask)[0])(fm)
    with torch.inference_mode():
        for fn in candidates.values():
            median_ms(fn, 3)
        times = {label: median_ms(fn, args.repeats) for label, fn in candidates.items()}
        for label, fn in candidates.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    fn()
            print(f"\n=== {label} N={args.seq_len} batch={args.batch_size}: median {times[label]:.2f} ms "
                  f"({times[label] / times['sdpa']:.2f}x sdpa)")
            events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
            for e in events[: args.rows]:
                print(f"  {e.key:42s} {e.self_cpu_time_total / 5 / 1e3:7.3f} ms  calls {e.count // 5:3d}")


if __name__ == "__main__":
    main()
