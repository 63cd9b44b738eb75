"""Does a passive OpenMP wait policy or fewer threads keep linearize usable on a busy machine?

Measures, for each thread setting, one training step and one single-sentence inference of the
real all-MiniLM-L6-v2 converted with Hedgehog (batch 8 × 64 tokens, AdamW over every parameter; then
batch 1 × 64 tokens, no gradient: the report's latency case), alone and while ``--busy`` other
processes spin on the CPU (``while True: pass``, like another training job). Every setting runs in
a fresh process: libgomp reads ``OMP_WAIT_POLICY`` once, when torch is loaded.

    PYTHONPATH=. python docs/experiments/busy-machine/measure.py --out runs/busy-machine

Writes ``results.json`` and ``results.md`` (medians in ms) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: (label, OMP_NUM_THREADS, the OpenMP environment: libgomp's default wait spins up to
#: GOMP_SPINCOUNT=300000 times before sleeping; PASSIVE sleeps at once)
SETTINGS = [("2 threads, default wait", 2, {}), ("2 threads, passive wait", 2, {"OMP_WAIT_POLICY": "PASSIVE"}),
            ("2 threads, spin 10k then sleep", 2, {"GOMP_SPINCOUNT": "10000"}), ("1 thread", 1, {})]
SPIN = "while True: pass"


def worker(steps, inferences):
    """Time ``steps`` training steps and ``inferences`` latencies in this process; print JSON."""
    import torch

    import linearize
    from linearize.convert import load_source_model

    torch.manual_seed(0)
    model = load_source_model("minilm")
    linearize.convert(model, method="hedgehog")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batch = {"input_ids": torch.randint(1000, 20000, (8, 64)), "attention_mask": torch.ones(8, 64, dtype=torch.long)}
    one = {name: value[:1] for name, value in batch.items()}
    model.train()
    step_times = []
    for _ in range(steps + 1):  # the first step (allocations, lazy init) is not counted
        start = time.perf_counter()
        loss = model(**batch).last_hidden_state.pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_times.append(time.perf_counter() - start)
    model.eval()
    latencies = []
    with torch.no_grad():
        for _ in range(inferences + 1):
            start = time.perf_counter()
            model(**one)
            latencies.append(time.perf_counter() - start)
    print(json.dumps({"step_ms": 1000 * statistics.median(step_times[1:]),
                      "latency_ms": 1000 * statistics.median(latencies[1:]), "threads": torch.get_num_threads()}))


def run_setting(threads, openmp, steps, inferences):
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **openmp)
    done = subprocess.run([sys.executable, __file__, "--worker", "--steps", str(steps), "--inferences", str(inferences)],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(busy_counts, steps, inferences):
    rows = []
    for busy in busy_counts:
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
        try:
            time.sleep(1.0 if busy else 0.0)
            for label, threads, openmp in SETTINGS:
                load = os.getloadavg()[0]
                result = run_setting(threads, openmp, steps, inferences)
                rows.append({"busy": busy, "setting": label, "load_before": round(load, 2), **result})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
    return rows


def markdown(rows):
    lines = ["| other busy processes | setting | train step (ms) | latency, 1 × 64 tokens (ms) | load avg before |",
             "|---|---|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['busy']} | {row['setting']} | {row['step_ms']:.0f} | {row['latency_ms']:.1f} | "
                     f"{row['load_before']} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--inferences", type=int, default=30)
    parser.add_argument("--busy", default="0,1,2", help="comma-separated counts of spinning processes")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.inferences)
        return
    rows = measure([int(x) for x in args.busy.split(",")], args.steps, args.inferences)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(rows, indent=1))
        (args.out / "results.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
