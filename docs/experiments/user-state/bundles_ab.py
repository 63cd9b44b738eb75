"""One attention layer's inference path as a saved model runs it, at an earlier commit against the working tree:
each build's bundled attention code (``hf_remote_code.bundled_sources``: what a saved folder's
``modeling_linearize.py`` carries) timed in fresh processes of its own, the two builds alternating process by
process (two builds in one process disturb each other: the second one loaded ran ~10% slower whichever it was).

A row is ``method:BxN`` (pure linear attention, ``[B, H, N, d]`` views of ``[B, N, H, d]`` tensors as BERT passes
them, MiniLM's 12 heads of 32) or ``hyb:method:BxN`` (hybrid, R = 32 + first; ``hybR:method:BxN`` another window,
e.g. ``hyb192``); ``lunar`` is the default recipe's LUNA (M = 16, per-head projections). Each process:
``torch.inference_mode()``, 2 threads, 3 warm-up calls, the median of 30; a row's figure is the median over
``--rounds`` processes of each build.

    PYTHONPATH=. python docs/experiments/user-state/bundles_ab.py --before 2e337e6 --rounds 4 \\
        hedgehog:1x900 hedgehog:8x128 hedgehog:8x512 hyb:hedgehog:1x900
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from linearize.convert.backends.hf_remote_code import bundled_sources
from linearize.markdown import markdown_table

CHILD = r"""
import importlib.util, json, statistics, sys, time
import torch
torch.set_num_threads(2)
spec = importlib.util.spec_from_file_location("bundle", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
sys.modules["bundle"] = mod
spec.loader.exec_module(mod)
heads, dim, medians = 12, 32, {}
for row in sys.argv[2:]:
    parts = row.split(":")
    hybrid, method, (batch, seq) = parts[0].startswith("hyb"), parts[-2], map(int, parts[-1].split("x"))
    radius = int(parts[0][3:] or 32) if hybrid else 0
    options = {"projections": 16, "shared_projections": False} if method == "lunar" else {}
    g = torch.Generator().manual_seed(0)
    q, k, v = (t.transpose(1, 2) for t in torch.randn(3, batch, seq, heads, dim, generator=g))
    fm = mod.create_feature_map("luna" if method == "lunar" else method, dim, heads, **options).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in fm.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    if hybrid:
        fm.make_hybrid(radius, "first")
        sinks = mod.sink_positions(None, batch, seq, mod.parse_sinks("first"), q.device)
        gamma = fm.hybrid_gamma().detach()
        call = lambda: mod.chunked_hybrid_attention(q, k, v, fm, radius, sinks, gamma, None, None, 1e-6)
    else:
        call = lambda: mod.linear_attention(q, k, v, fm)
    with torch.inference_mode():
        for _ in range(3):
            call()
        times = []
        for _ in range(30):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    medians[row] = 1000 * statistics.median(times)
print(json.dumps(medians))
"""


def bundle_at(commit, folder):
    """The bundled attention code of ``commit`` (a temporary ``git worktree``), written into ``folder``."""
    tree = Path(folder) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], check=True, capture_output=True)
    try:
        code = subprocess.run([sys.executable, "-c", "from linearize.convert.backends.hf_remote_code import "
                               "bundled_sources; print(bundled_sources())"], cwd=tree, check=True,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)}).stdout
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], check=True, capture_output=True)
    path = Path(folder) / "before.py"
    path.write_text(code)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+")
    parser.add_argument("--before", required=True, help="the earlier commit")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp()
    builds = {"before": bundle_at(args.before, folder), "after": Path(folder) / "after.py"}
    builds["after"].write_text(bundled_sources())
    runs = {name: [] for name in builds}
    for _ in range(args.rounds):
        for name, path in builds.items():
            out = subprocess.run([sys.executable, "-c", CHILD, str(path), *args.rows], check=True,
                                 capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    rows = []
    for row in args.rows:
        before, after = (statistics.median(run[row] for run in runs[name]) for name in builds)
        rows.append([row, f"{before:.2f}", f"{after:.2f}", f"{after / before:.3f}",
                     " / ".join(f"{run[row]:.2f}" for run in runs["before"]),
                     " / ".join(f"{run[row]:.2f}" for run in runs["after"])])
    print(markdown_table(["row", f"before ({args.before}), ms", "after, ms", "after ÷ before", "before per process",
                          "after per process"], rows))


if __name__ == "__main__":
    main()
