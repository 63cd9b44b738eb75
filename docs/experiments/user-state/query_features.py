"""A query's features with and without their log-scale (issue 35): one feature-map call of DARKFormer and
Performer at MiniLM's geometry (12 heads of 32), written into a head-major buffer as the chunked inference path
does, ``log_scale=True`` (a key's call) and ``log_scale=False`` (a query's) alternating in one process, 2 threads,
``torch.inference_mode()``, medians of 180 calls each after 20 warm-up pairs. In the linearize process: the
saving of one call, not a user-state figure.

    PYTHONPATH=. python docs/experiments/user-state/query_features.py
"""

import statistics
import time

import torch

from linearize.attention import create_feature_map


def main():
    torch.set_num_threads(2)
    for name in ["darkformer", "performer"]:
        fm = create_feature_map(name, 32, 12).eval()
        for batch, seq in [(8, 128), (1, 4096)]:
            x = torch.randn(batch, seq, 12, 32).transpose(1, 2)  # [B, H, N, d] as BERT passes it
            buffer = torch.empty(12, batch, seq, fm.feature_dim).transpose(0, 1)
            times = {True: [], False: []}
            with torch.inference_mode():
                for i in range(400):
                    log_scale = bool(i % 2)
                    start = time.perf_counter()
                    fm(x, out=buffer, log_scale=log_scale)
                    times[log_scale].append(time.perf_counter() - start)
            full, query = (1000 * statistics.median(times[flag][40:]) for flag in (True, False))
            print(f"{name} {batch}x{seq}: with the log-scale {full:.3f} ms, a query's {query:.3f} ms "
                  f"({query / full:.2f})")


if __name__ == "__main__":
    main()
