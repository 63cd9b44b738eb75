"""Forward + backward of one hybrid attention layer (Hedgehog, window R + first sink, 1 x 12 heads, head dim 32,
one thread): median ms of 7 calls after 2 warm-ups (hybrid RESULTS section 12).

    python docs/experiments/hybrid/training-path/layer_fwd_bwd.py 2048 32 after
    git worktree add /tmp/before HEAD~1 && PYTHONPATH=/tmp/before python .../layer_fwd_bwd.py 2048 32 before
"""
import torch, time, statistics, sys
from linearize.attention import create_feature_map
from linearize.attention.hybrid import hybrid_attention
torch.set_num_threads(1)
N=int(sys.argv[1]); R=int(sys.argv[2])
fm = create_feature_map("hedgehog", head_dim=32, num_heads=12).train()
q,k,v = (torch.randn(1,12,N,32, requires_grad=True) for _ in range(3))
gamma = torch.ones(12, requires_grad=True)
def hyb():
    out = hybrid_attention(q,k,v,fm,R,("first",),gamma); out.sum().backward()
for _ in range(2): hyb()
ts=[]
for _ in range(7):
    t=time.perf_counter(); hyb(); ts.append((time.perf_counter()-t)*1000)
print(sys.argv[3], N, R, round(statistics.median(ts),1))
