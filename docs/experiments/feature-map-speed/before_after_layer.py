"""Before/after of one attention layer in one process, interleaved: the base commit's package copied as
``linearize_before`` into /tmp/speed/bp (git archive 6ee126d linearize), q/k/v in the layout Hugging Face
models pass ([B,N,H,d] memory), batch 8; the minimum thread CPU time over the timed rounds (ms).
Run: OMP_NUM_THREADS=1 python docs/experiments/feature-map-speed/before_after_layer.py 128,512"""
import sys, time, torch, torch.nn.functional as F
sys.path.insert(0, "/tmp/speed/bp")
import linearize_before.attention.feature_maps as fb
import linearize.attention.feature_maps as fa
from linearize.bench import recipe_luna
M = {"luna": ("luna", {}), "recipe": recipe_luna(), "hedgehog": ("hedgehog", {}), "t2r": ("t2r", {}), "darkformer": ("darkformer", {})}
names = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] else list(M)
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 20
for N in [int(x) for x in sys.argv[1].split(",")]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(8, N, 384).view(8, N, 12, 32).transpose(1, 2) for _ in range(3))
    fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v).transpose(1, 2).contiguous()}
    for name in names:
        m, o = M[name]
        for tag, mod in (("old", fb), ("new", fa)):
            torch.manual_seed(0)
            fm = mod.create_feature_map(m, 32, 12, **o).eval()
            fns[f"{name}-{tag}"] = (lambda fm: lambda: fm.attend(q, k, v)[0].transpose(1, 2).contiguous())(fm)
    best = {n: 1e9 for n in fns}
    with torch.inference_mode():
        for r in range(rounds):
            for n, fn in fns.items():
                s = time.thread_time(); fn(); e = time.thread_time() - s
                if r >= 2: best[n] = min(best[n], e * 1e3)
    base = best["sdpa"]
    print(f"N={N} sdpa {base:.2f}")
    for name in names:
        o, n_ = best[f"{name}-old"], best[f"{name}-new"]
        print(f"   {name:10s} old {o:7.2f} ({o/base:.2f})  new {n_:7.2f} ({n_/base:.2f})  new/old {n_/o:.2f}", flush=True)
