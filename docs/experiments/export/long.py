"""ONNX Runtime at long lengths (issue 35, item 3): all-MiniLM-L6-v2 with its positions tiled to the longest
length, exported by `linearize export` as softmax (plain transformers) and converted to METHOD, each graph
timed in ONNX Runtime (CPU provider) at every length, in fresh processes, the two graphs interleaved.

    PYTHONPATH=. python docs/experiments/export/long.py --out docs/experiments/export/long \\
        --method hedgehog --seq-lens 512,2048,4096 --processes 5 --threads 2

Hybrid attention (issue 34) the same way: ``--window 32 --sinks first --hybrid-layers 1,2`` (the long reviews'
default) exports the converted model with that window, its graph named ``METHOD-wR-layers`` (``--name``).

Writes GRAPHS/softmax.onnx and GRAPHS/METHOD.onnx (``--graphs``, default runs/export-long; reused when
present: the export takes a minute each), and OUT/long.json and OUT/long.md (atomically): per length the median time of each graph in each process, the
speed-up softmax ÷ METHOD per process, and their median, lowest and highest. Batch 1, no padding, random
token ids, float32.
"""

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, statistics, sys, time
import numpy, onnxruntime
paths, seq_lens, threads, repeats = json.loads(sys.argv[1])
options = onnxruntime.SessionOptions()
options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
sessions = {name: onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            for name, path in paths.items()}
rng = numpy.random.default_rng(0)
result = {}
for n in seq_lens:
    feed = {"input_ids": rng.integers(1000, 30000, (1, n)), "attention_mask": numpy.ones((1, n), numpy.int64),
            "token_type_ids": numpy.zeros((1, n), numpy.int64)}
    times = {name: [] for name in sessions}
    for session in sessions.values():  # warm-up
        session.run(None, feed)
    for index in range(repeats):
        for name in (list(sessions) if index % 2 == 0 else list(sessions)[::-1]):
            start = time.perf_counter()
            sessions[name].run(None, feed)
            times[name].append(1000 * (time.perf_counter() - start))
    result[n] = {name: statistics.median(values) for name, values in times.items()}
print(json.dumps(result))
"""


def export_graphs(out, method, longest, name=None, hybrid=None):
    """``{"softmax": path, name: path}``: the two graphs, exported unless already there; ``name`` (default
    ``method``) the converted one's, converted with the ``hybrid`` keywords of ``linearize.convert`` (window,
    sinks, hybrid_layers)."""
    import torch
    import transformers

    import linearize
    from linearize.convert.loading import minilm_path
    from linearize.convert.positions import extend_positions
    from linearize.export import export_model

    name = name or method
    paths = {"softmax": out / "softmax.onnx", name: out / f"{name}.onnx"}
    if all(path.exists() for path in paths.values()):
        return paths
    torch.manual_seed(0)
    base = transformers.AutoModel.from_pretrained(minilm_path()).eval()
    softmax = copy.deepcopy(base)
    extend_positions(softmax, longest)
    models = {"softmax": softmax, name: linearize.convert(base, method, max_length=longest, **(hybrid or {}))}
    for name, model in models.items():
        if not paths[name].exists():
            print(f"exporting {name} to {paths[name]}", flush=True)
            export_model(model, paths[name], check=False)
    return paths


def time_in_processes(paths, seq_lens, processes, threads, repeats):
    """Per process: ``{N: {name: median ms}}``, each process a fresh interpreter with ONNX Runtime only."""
    runs = []
    for index in range(processes):
        order = dict(reversed(list(paths.items()))) if index % 2 else paths
        argument = json.dumps([{name: str(path) for name, path in order.items()}, seq_lens, threads, repeats])
        done = subprocess.run([sys.executable, "-c", CHILD, argument], check=True, capture_output=True, text=True,
                              env={key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")})
        runs.append({int(n): times for n, times in json.loads(done.stdout.strip().splitlines()[-1]).items()})
        print(f"process {index + 1}/{processes}: {runs[-1]}", flush=True)
    return runs


def summary(runs, method, seq_lens):
    rows = []
    for n in seq_lens:
        ratios = [run[n]["softmax"] / run[n][method] for run in runs]
        rows.append({"seq_len": n, "softmax_ms": [run[n]["softmax"] for run in runs],
                     f"{method}_ms": [run[n][method] for run in runs],
                     "speedup": {"median": statistics.median(ratios), "lowest": min(ratios), "highest": max(ratios),
                                 "per_process": ratios}})
    return rows


def markdown(rows, method, args):
    lines = [f"# ONNX Runtime at long lengths: softmax against {method}", "",
             f"`{' '.join(sys.argv)}`", "",
             f"Batch 1, float32, CPU provider, {args.threads} intra-op threads, {args.processes} fresh processes, "
             f"medians of {args.repeats} runs per process after one warm-up, the graphs interleaved.", "",
             f"| N | softmax (ms, median) | {method} (ms, median) | softmax ÷ {method}: median (lowest-highest) |",
             "|--:|--:|--:|--:|"]
    for row in rows:
        speed = row["speedup"]
        lines.append(f"| {row['seq_len']:,} | {statistics.median(row['softmax_ms']):.1f} | "
                     f"{statistics.median(row[f'{method}_ms']):.1f} | {speed['median']:.2f}× "
                     f"({speed['lowest']:.2f}-{speed['highest']:.2f}) |")
    return "\n".join(lines) + "\n"


def write_atomically(path, text):
    temporary = path.with_name(f".{path.name}.partial")
    temporary.write_text(text)
    os.replace(temporary, path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("docs/experiments/export/long"))
    parser.add_argument("--graphs", type=Path, default=Path("runs/export-long"), help="where the graphs go")
    parser.add_argument("--method", default="hedgehog")
    parser.add_argument("--seq-lens", default="512,2048,4096")
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=None, help="hybrid attention: the window R")
    parser.add_argument("--sinks", default=None, help="hybrid attention: the sinks (first, first,last)")
    parser.add_argument("--hybrid-layers", default=None, help="hybrid attention in these layers only (1,2)")
    args = parser.parse_args()
    hybrid = {key: value for key, value in (("window", args.window), ("sinks", args.sinks), (
        "hybrid_layers", None if args.hybrid_layers is None else [int(i) for i in args.hybrid_layers.split(",")]))
        if value is not None}
    name = args.method + (f"-w{args.window}" if args.window else "") + (
        f"-layers{args.hybrid_layers.replace(',', '')}" if args.hybrid_layers else "")
    seq_lens = [int(n) for n in args.seq_lens.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    args.graphs.mkdir(parents=True, exist_ok=True)
    paths = export_graphs(args.graphs, args.method, max(512, *seq_lens), name, hybrid)  # MiniLM has 512 positions
    rows = summary(time_in_processes(paths, seq_lens, args.processes, args.threads, args.repeats), name, seq_lens)
    write_atomically(args.out / "long.json", json.dumps({"command": sys.argv, "rows": rows}, indent=1))
    write_atomically(args.out / "long.md", markdown(rows, name, args))
    print(markdown(rows, name, args))


if __name__ == "__main__":
    main()
