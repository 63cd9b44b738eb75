"""Stage 1's blockwise loss and its backward for one layer, pure Hedgehog against hybrid (R = 32 + first):
MiniLM geometry (12 heads, head dim 32), BATCH sequences of 2,048 tokens (default 2; the long-review recipe's
stage 1 takes 8), blocks of 512 query rows (fewer at batch 8: a block holds at most 2**24 row elements), 2 threads;
three repetitions each, seconds.

    PYTHONPATH=. python docs/experiments/hybrid/stage1_cost.py [BATCH]
"""
import sys, torch, time
from linearize.attention import create_feature_map
from linearize.distill.blockwise import blockwise_distillation_terms
torch.manual_seed(0); torch.set_num_threads(2)
B,H,N,d=int(sys.argv[1]) if len(sys.argv) > 1 else 2,12,2048,32
for hyb in (False, True):
    fm = create_feature_map("hedgehog", d, H)
    if hyb: fm.make_hybrid(32, "first")
    q,k,v=(torch.randn(B,H,N,d, requires_grad=True) for _ in range(3))
    ts=[]
    for r in range(3):
        s=time.perf_counter()
        t=blockwise_distillation_terms(q,k,v,fm,block_size=512)
        t.ce.backward()
        ts.append(time.perf_counter()-s)
    print("hybrid" if hyb else "pure", [round(x,2) for x in ts])
