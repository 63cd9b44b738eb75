"""Per-layer time of the hybrid exact window as a band (commit 91a5ff2) and as BigBird blocks (now), beside
SDPA and pure linear attention: MiniLM geometry (12 heads, head dim 32), Hedgehog, batch 1, fp32, medians of 11
interleaved rounds."""
import shutil, statistics, sys, time, torch, torch.nn.functional as F
import subprocess; open("/tmp/hybrid_band.py", "w").write(subprocess.run(["git", "show", "91a5ff2:linearize/attention/hybrid.py"], capture_output=True, text=True, check=True).stdout); shutil.copy("/tmp/hybrid_band.py", "linearize/attention/hybrid_band_tmp.py")
try:
    from linearize.attention import create_feature_map
    from linearize.attention.core import linear_attention
    from linearize.attention.hybrid import hybrid_attention as blocked
    from linearize.attention.hybrid_band_tmp import hybrid_attention as band
finally:
    import os; os.remove("linearize/attention/hybrid_band_tmp.py")
torch.manual_seed(0)
fm = create_feature_map("hedgehog", 32, 12); g = torch.full((12,), 0.1)
print("| N | R | sinks | SDPA | linear | band | blocks | band ÷ blocks |"); print("|--:|--:|:--|--:|--:|--:|--:|--:|")
with torch.inference_mode():
    for n in (2048, 4096):
        q, k, v = (torch.randn(1, 12, n, 32) for _ in range(3))
        for radius in (16, 32, 64):
            cands = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v), "linear": lambda: linear_attention(q, k, v, fm),
                     "band": lambda: band(q, k, v, fm, radius, ("first",), g), "blocks": lambda: blocked(q, k, v, fm, radius, ("first",), g)}
            times = {name: [] for name in cands}
            for f in cands.values(): f()
            for rnd in range(11):
                for name in (list(cands) if rnd % 2 == 0 else list(cands)[::-1]):
                    s = time.perf_counter(); cands[name](); times[name].append(1000 * (time.perf_counter() - s))
            m = {name: statistics.median(t) for name, t in times.items()}
            print(f"| {n:,} | {radius} | first | {m['sdpa']:.1f} | {m['linear']:.1f} | {m['band']:.1f} | {m['blocks']:.1f} | {m['band'] / m['blocks']:.2f} |", flush=True)
