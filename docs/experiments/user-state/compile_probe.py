import time, statistics, torch, sys
torch.set_num_threads(2)
from linearize.attention.core import linear_attention
from linearize.attention.feature_maps.hedgehog import HedgehogFeatureMap
import torch.nn.functional as F
B,H,N,d = int(sys.argv[1]), 12, int(sys.argv[2]), 32
fm = HedgehogFeatureMap(d, H).eval()
torch.manual_seed(0)
q,k,v = (torch.randn(B,H,N,d) for _ in range(3))
def eager(): return linear_attention(q,k,v,fm)
def sdpa(): return F.scaled_dot_product_attention(q,k,v)
# one-shot math compiled
W = fm.weight.detach()
def oneshot(q,k,v,W):
    s = d ** -0.25
    def phi(x):
        z = torch.einsum('bhnd,hfd->bhnf', x*s, W)
        z = torch.stack([z,-z],-2)
        return torch.softmax(z,-1).flatten(-2)
    pq, pk = phi(q), phi(k)
    S = pk.transpose(-1,-2) @ v
    zsum = pk.sum(-2)
    num = pq @ S
    den = (pq * zsum.unsqueeze(-2)).sum(-1, keepdim=True) + 1e-6
    return num/den
comp = torch.compile(oneshot, dynamic=False)
with torch.inference_mode():
    ref = eager(); out = comp(q,k,v,W); print('maxdiff', (ref-out).abs().max().item())
    def t(f, n=30):
        for _ in range(5): f()
        xs=[]
        for _ in range(n):
            t0=time.perf_counter(); f(); xs.append(time.perf_counter()-t0)
        return statistics.median(xs)*1e3
    for r in range(3):
        print('eager %.2f  compiled %.2f  oneshot-eager %.2f  sdpa %.2f' % (t(eager), t(lambda: comp(q,k,v,W)), t(lambda: oneshot(q,k,v,W)), t(sdpa)))
