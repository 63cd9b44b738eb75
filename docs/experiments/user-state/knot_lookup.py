"""LUNA's knot lookup, the grid as one ``[cells, 1 + candidates]`` table (before 2026-11-27, seventh session)
against one contiguous column per candidate (now), in one process on the same values (issue 35).

The "before" functions are copies of the old ``knot_index_into`` and ``piecewise_linear_into``; both versions
must give identical indices and features (asserted). Prints the median microseconds of each over 40 calls,
three times, for 196,608 values (one chunk of 1,024 tokens × 12 heads × M = 16 projections, the recipe's LUNA).

    PYTHONPATH=. .venv/bin/python docs/experiments/user-state/knot_lookup.py 1   # threads
    PYTHONPATH=. .venv/bin/python docs/experiments/user-state/knot_lookup.py 2
"""
import time, torch, sys
from linearize.attention.feature_maps import create_feature_map
from linearize.attention.core import scratch
from linearize.attention.feature_maps.luna import piecewise_linear_into
torch.set_num_threads(int(sys.argv[1])); torch.manual_seed(0)
fm = create_feature_map("luna", 32, 12, projections=16, shared_projections=False).eval()
n = 12*1024*16
u = torch.randn(n)*2
def old_ki(flat, grid, rows_t):
    n = flat.numel()
    index = scratch("o.index", (n,), flat.device, torch.int32)
    cell = torch.addcmul(torch.tensor(grid["offset"]), flat, torch.tensor(grid["inverse_width"]), out=scratch("o.cell", (n,), flat.device, flat.dtype))
    cells = scratch("o.cells", (n,), flat.device, torch.int32)
    cells.copy_(cell.nan_to_num_(0.0).clamp_(0.0, grid["cells"] + 1))
    rows = scratch("o.rows", (n, rows_t.shape[1]), flat.device, rows_t.dtype)
    torch.index_select(rows_t, 0, cells, out=rows)
    count, above = rows[:, 0], scratch("o.above", (n,), flat.device, rows.dtype)
    for column in range(1, rows.shape[1]):
        count += torch.ge(flat, rows[:, column], out=above)
    return index.copy_(count)
def old_pw(u, table, index, out):
    channels = table.shape[1] // 2
    slopes = scratch("o.slopes", (u.numel(), channels), u.device, table.dtype)
    torch.index_select(table[:, :channels].contiguous(), 0, index, out=slopes)
    torch.index_select(table[:, channels:].contiguous(), 0, index, out=out)
    return out.addcmul_(slopes, u[:, None]).relu_()
with torch.inference_mode():
    table, st = fm._psi_table(u.dtype, u.device, 0.25)
    g = st["grid"]
    rows_t = torch.stack([g["left"], *g["candidates"]], 1).contiguous()
    print("cells", g["cells"], "candidates", len(g["candidates"]))
    a = old_ki(u, g, rows_t).clone(); b = fm.knot_index_into(u, st).clone(); assert torch.equal(a, b)
    out1 = torch.empty(n, 8); out2 = torch.empty(n, 8)
    def timeit(f,k=40):
        ts=[]
        for _ in range(k):
            t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
        ts.sort(); return round(1e6*ts[k//2])
    for _ in range(3):
        print("knot index old/new us", timeit(lambda: old_ki(u, g, rows_t)), timeit(lambda: fm.knot_index_into(u, st)),
              "piecewise old/new", timeit(lambda: old_pw(u, table, a, out1)), timeit(lambda: piecewise_linear_into(u, table, a, out2)))
    assert torch.equal(out1, out2)
