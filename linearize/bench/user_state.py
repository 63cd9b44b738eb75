"""The speed a user's own process gets: saved folders timed in fresh child processes.

People who use a converted model never run the ``linearize`` command: they load its folder with
plain transformers (``trust_remote_code=True``) in their own process, under glibc's default
allocator, with whatever ran before in that process. The ``linearize`` command tunes malloc
(:mod:`linearize.allocator`) and keeps everything in one warm process, so what it measures
in-process sits at the top of what a user gets. Here each process is what a user has:

- a fresh interpreter started with the parent's environment less glibc's malloc settings
  (``MALLOC_*`` variables and ``GLIBC_TUNABLES``: the default allocator);
- ``linearize`` cannot be imported in it (``sys.modules["linearize"] = None``): the folders load
  with ``transformers.AutoModel.from_pretrained(folder, trust_remote_code=True)`` alone;
- ``torch.set_num_threads(threads)`` and ``torch.inference_mode()`` (as a serving loop or a
  transformers pipeline runs a model);
- in each process the models are timed interleaved, the order alternating every round, and the
  first model alternates between processes; a process's figure is its median over ``repeats``
  rounds after ``warmup`` untimed ones, with the median minor page faults per forward;
- with ``memory``, the first process also profiles one untimed forward per model and length, after
  that length's timings, for its peak extra memory (the code of :mod:`linearize.bench.peak_memory`,
  loaded by its path, not as part of linearize).

Over ``processes`` processes a length's row gives each model's median of the processes' medians,
and for every model its time ratio to the reference (reference ÷ model) per process: the median,
the lowest and the highest, so a figure comes with how far a single process strays from it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from ..errors import LinearizeError

#: what one child process runs: argv[1] is a JSON spec, the last stdout line its JSON rows
CHILD = r"""
import importlib.util, json, resource, statistics, sys, time
sys.modules["linearize"] = None  # the user's process: linearize is not installed there
import torch, transformers

spec = json.loads(sys.argv[1])
if spec["memory_code"]:  # linearize/bench/peak_memory.py (torch alone), loaded by its path: not the package
    found = importlib.util.spec_from_file_location("peak_memory", spec["memory_code"])
    peak_memory = importlib.util.module_from_spec(found)
    found.loader.exec_module(peak_memory)
torch.set_num_threads(spec["threads"])
device, dtype = torch.device(spec["device"]), getattr(torch, spec["dtype"])
models = {label: transformers.AutoModel.from_pretrained(path, trust_remote_code=True, dtype=dtype).to(device).eval()
          for label, path in spec["folders"].items()}
if spec["compile_mode"]:
    models = {label: torch.compile(model, mode=spec["compile_mode"]) for label, model in models.items()}
vocab = min(m.config.vocab_size for m in models.values())

def synchronize():
    if device.type == "cuda":
        torch.cuda.synchronize(device)

def forward(model, inputs):
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    synchronize()
    start = time.perf_counter()
    model(**inputs)
    synchronize()
    return time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

rows = []
with torch.inference_mode():
    for n in spec["seq_lens"]:
        generator = torch.Generator().manual_seed(spec["seed"] + n)
        ids = torch.randint(5, vocab, (spec["batch_size"], n), generator=generator).to(device)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        labels = [label for label in spec["order"] if n not in spec["skip"].get(label, [])]
        for _ in range(spec["warmup"]):
            for label in labels:
                forward(models[label], inputs)
        seconds, faults = {label: [] for label in labels}, {label: [] for label in labels}
        for round_ in range(spec["repeats"]):
            for label in (labels if round_ % 2 == 0 else labels[::-1]):
                elapsed, count = forward(models[label], inputs)
                seconds[label].append(elapsed)
                faults[label].append(count)
        rows.append({"seq_len": n, "median_ms": {k: 1000 * statistics.median(v) for k, v in seconds.items()},
                     "faults": {k: statistics.median(v) for k, v in faults.items()}})
        if spec["memory_code"]:  # one untimed forward each, after the timings (as linearize's own bench does)
            rows[-1]["peak_extra_bytes"] = {label: peak_memory.peak_extra_bytes(
                lambda: models[label](**inputs), device) for label in labels}
import os
state = {"linearize_loaded": sys.modules.get("linearize") is not None, "threads": torch.get_num_threads(),
         "device": str(device), "dtype": spec["dtype"], "compile_mode": spec["compile_mode"],
         "malloc_settings": sorted(k for k in os.environ if k.startswith("MALLOC_") or k == "GLIBC_TUNABLES")}
print(json.dumps({"rows": rows, "state": state}))
"""


#: the peak-memory code the child loads by its path (torch alone: the child cannot import linearize)
MEMORY_CODE = str(Path(__file__).with_name("peak_memory.py"))


def user_environment():
    """The parent's environment less glibc's malloc settings: a child gets the default allocator."""
    return {key: value for key, value in os.environ.items()
            if not key.startswith("MALLOC_") and key != "GLIBC_TUNABLES"}


def run_child(spec, timeout=None):
    """One fresh process's rows (see :data:`CHILD`); a failed child is a one-line error with its
    last line of stderr."""
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True,
                          env=user_environment(), timeout=timeout)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise LinearizeError(f"a measuring process (plain transformers, no linearize) failed: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # {"rows": [...], "state": {...}}


def user_state_rows(folders, reference, seq_lens, *, processes=5, threads=2, repeats=3, warmup=1, batch_size=1,
                    seed=0, skip=None, log=None, device="cpu", dtype="float32", compile_mode=None, memory=False):
    """Rows as :func:`linearize.bench.measure_lengths` gives them (``results[label]`` with
    ``median_ms`` and ``time_vs_softmax`` against ``reference``), measured in ``processes`` fresh
    processes (module docstring); each result also has ``faults_per_forward`` and, for the
    converted models, ``speedup`` ``{median, lowest, highest, per_process}`` (reference ÷ model).
    ``folders``: ``{label: saved folder}``; ``skip``: ``{label: [lengths not to run]}`` (softmax
    past its memory cap); ``device`` and ``dtype`` (a torch dtype's name): where and how each process
    loads the folders (``from_pretrained(..., dtype=dtype).to(device)``; on CUDA each forward is
    timed between two ``torch.cuda.synchronize`` calls); ``compile_mode``: each process compiles every
    model with ``torch.compile(model, mode=compile_mode)`` before its warm-up (None: eager); ``memory``: the first
    process also gives each model's peak extra memory of one untimed forward after a length's timings
    (``peak_extra_bytes``, :mod:`linearize.bench.peak_memory`: the bytes PyTorch allocates, which do not depend
    on the process or its allocator, so one process measures them)."""
    if processes < 1:
        raise LinearizeError(f"processes must be >= 1, got {processes}")
    labels = list(folders)
    spec = {"folders": {k: str(v) for k, v in folders.items()}, "seq_lens": [int(n) for n in seq_lens],
            "threads": int(threads), "repeats": int(repeats), "warmup": int(warmup), "batch_size": int(batch_size),
            "seed": int(seed), "device": str(device), "dtype": str(dtype),
            "compile_mode": compile_mode, "skip": {k: [int(n) for n in v] for k, v in (skip or {}).items()}}
    runs = []
    for index in range(processes):
        child = run_child({**spec, "order": labels if index % 2 == 0 else labels[::-1],
                           "memory_code": MEMORY_CODE if memory and index == 0 else None})
        if child["state"]["linearize_loaded"] or child["state"]["malloc_settings"]:
            raise RuntimeError(f"a measuring process was not in the user's state: {child['state']}")
        runs.append(child["rows"])
        if log:
            log(f"process {index + 1}/{processes}: " + "; ".join(
                f"N={row['seq_len']}: " + ", ".join(f"{k} {v:.1f}" for k, v in row["median_ms"].items())
                for row in runs[-1]) + " ms")
    return [_row(n, [run[i] for run in runs], labels, reference) for i, n in enumerate(spec["seq_lens"])]


def _row(n, per_process, labels, reference):
    """One length's row from the processes' entries for it."""
    results = {}
    for label in labels:
        times = [entry["median_ms"][label] for entry in per_process if label in entry["median_ms"]]
        if not times:
            continue
        faults = [entry["faults"][label] for entry in per_process if label in entry["faults"]]
        results[label] = {"median_ms": statistics.median(times), "per_process_ms": times,
                          "faults_per_forward": statistics.median(faults)}
        peaks = [entry["peak_extra_bytes"][label] for entry in per_process if label in entry.get("peak_extra_bytes", {})]
        if peaks:
            results[label]["peak_extra_bytes"] = peaks[0]
    if reference in results:
        for label, entry in results.items():
            ratios = [run["median_ms"][reference] / run["median_ms"][label] for run in per_process
                      if label in run["median_ms"] and reference in run["median_ms"]]
            entry["time_vs_softmax"] = 1.0
            if label != reference:  # the figure is the median of the per-process ratios, not a ratio of medians
                entry["speedup"] = {"median": statistics.median(ratios), "lowest": min(ratios),
                                    "highest": max(ratios), "per_process": ratios}
                entry["time_vs_softmax"] = 1.0 / entry["speedup"]["median"]
    skipped = {label: "past the softmax memory cap" for label in labels if label not in results}
    return {"seq_len": n, "results": results, "skipped": skipped, "processes": len(per_process)}
