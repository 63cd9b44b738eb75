"""glibc's malloc thresholds and a converted all-MiniLM-L6-v2 on CPU (linearize/allocator.py).

Each setting runs in its own process (the allocator is per process), settings interleaved round
by round: a forward of the softmax model and of a Hedgehog conversion (batch 8 × 128 tokens,
inference mode) and a Hedgehog training step (batch 32 × 64, AdamW). Per setting and round: the
median wall-clock ms and the process CPU ms (user + system, page faults' kernel time included)
per call, minor page faults per call, and the process's peak resident memory.

    PYTHONPATH=. python docs/experiments/cpu-allocator/measure.py --rounds 3 --threads 2 --out runs/cpu-allocator

Settings: ``default`` (glibc as it starts) and ``keep`` (:func:`linearize.allocator.keep_freed_memory`).
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = ("default", "keep")


def measure_one(setting, threads, calls):
    from linearize import allocator

    if setting == "keep":
        allocator.keep_freed_memory()
    import torch

    from linearize.bench import load_model
    from linearize.convert import convert

    torch.set_num_threads(threads)
    base = load_model("minilm").eval()
    student = convert(copy.deepcopy(base), "hedgehog")
    ids = torch.randint(1000, 20000, (8, 128))
    result = {"setting": setting, "malloc": allocator.state, "threads": threads}
    with torch.inference_mode():
        result["forward_softmax"] = per_call(lambda: base(input_ids=ids, attention_mask=torch.ones_like(ids)), calls)
        result["forward_hedgehog"] = per_call(lambda: student(input_ids=ids, attention_mask=torch.ones_like(ids)),
                                              calls)
    student.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5)
    batch = {"input_ids": torch.randint(1000, 20000, (32, 64)), "labels": torch.randint(0, 2, (32,))}

    def step():
        student(**batch, attention_mask=torch.ones_like(batch["input_ids"])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    result["train_step_hedgehog"] = per_call(step, max(3, calls // 2))
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return result


def per_call(fn, calls, warmup=2):
    for _ in range(warmup):
        fn()
    walls, cpus, faults = [], [], []
    for _ in range(calls):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        fn()
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        walls.append(wall)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        faults.append(after.ru_minflt - before.ru_minflt)
    return {"wall_ms": round(1e3 * statistics.median(walls), 1), "cpu_ms": round(1e3 * statistics.median(cpus), 1),
            "faults": statistics.median(faults)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("runs/cpu-allocator"))
    parser.add_argument("--one", choices=SETTINGS, help=argparse.SUPPRESS)  # a child process: one setting
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one, args.threads, args.calls)))
        return
    rows = []
    for round_index in range(args.rounds):
        for setting in SETTINGS if round_index % 2 == 0 else SETTINGS[::-1]:
            done = subprocess.run([sys.executable, __file__, "--one", setting, "--threads", str(args.threads),
                                   "--calls", str(args.calls)], capture_output=True, text=True, check=True)
            rows.append({"round": round_index, **json.loads(done.stdout.strip().splitlines()[-1])})
            print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu-allocator.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
