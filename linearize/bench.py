"""Speed and memory of linear attention against softmax attention, measured side by side.

``run_bench(out_dir, ...)`` measures, in one process and one run:

1. **Attention layer** (MiniLM geometry by default: batch 1, 12 heads, head dim 32), for every
   sequence length: softmax through PyTorch's ``F.scaled_dot_product_attention`` ("sdpa", the
   best softmax path on CPU), eager softmax (``softmax(QKᵀ·scale)·V`` as explicit matmuls, what
   Hugging Face's ``eager`` implementation does), and each method's linear path
   (``FeatureMap.attend``, i.e. :func:`linearize.attention.linear_attention`).
2. **Whole model** (optional): the forward of a Hugging Face model at its own lengths, softmax
   (the model's own attention implementation, and eager) against a converted deep copy per
   method.

How it is measured:

- Latency: wall-clock ``time.perf_counter`` (or, ``clock="cpu"``, the process's CPU time) of one
  forward under ``torch.inference_mode`` (on CUDA bracketed by ``torch.cuda.synchronize()``),
  ``warmup`` untimed rounds then ``repeats`` timed rounds. Every round runs every candidate once,
  in an order rotated each round, so machine drift and neighbours' load hit all candidates alike.
  Reported: the median (and min/max) per candidate, and ratios against sdpa.
- Peak memory: the extra memory PyTorch's CPU allocator hands out during one forward, output
  included, inputs and weights excluded: ``torch.profiler`` with ``profile_memory=True`` records
  every allocation and free; the peak of their running sum is reported. Memory that bypasses
  ATen's allocator (oneDNN/BLAS scratch, thread stacks) and allocator fragmentation are not
  counted. A separate, untimed forward is profiled, so profiling overhead never enters latency.
  On CUDA: ``torch.cuda.max_memory_allocated`` during that forward minus what was allocated before.
- Eager softmax is skipped where its two N×N matrices would exceed ``eager_max_bytes``.

Outputs in ``out_dir``: ``bench.json`` (all numbers, machine info, crossovers; written
atomically), ``bench.md`` (tables) and ``bench.png`` (log-log time and memory against N).
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import allocator
from .errors import LinearizeError
from .io import atomic_write_json, atomic_write_text
from .machine import physical_memory
from .placement import CPU, Placement
from .threads import cpu_snapshot, other_processes_cores, set_threads

DEFAULT_SEQ_LENS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_MODEL_SEQ_LENS = (128, 512)
SDPA, EAGER = "sdpa", "eager"
#: SDPA pinned to one of its CUDA kernels (benchmarked beside the dispatching ``sdpa`` on a GPU)
SDPA_FLASH, SDPA_EFFICIENT = "sdpa (flash)", "sdpa (mem-efficient)"
SOFTMAX_LABELS = (SDPA, SDPA_FLASH, SDPA_EFFICIENT, EAGER)
#: the targets of the benchmark issue (speedup of every method over sdpa at one length)
ATTENTION_TARGET = {"seq_len": 4096, "min_speedup": 4.0}
MODEL_TARGET = {"seq_len": 512, "max_ratio": 1.0}


# ---- machine -------------------------------------------------------------------------------------

def cpu_model():
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine_info():
    """CPU model, cores, memory, torch build and threads, load average."""
    cpu = cpu_model()
    memory = physical_memory()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu_model": cpu or platform.processor() or platform.machine(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": round(memory / 2**30, 1) if memory else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "libgomp default"),
        "malloc": allocator.state,
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
        "mkl": bool(torch.backends.mkl.is_available()),
        "load_average_start": _load_average(),
    }


def _busy_warning(machine):
    """A note when other processes used the CPU during the run: intra-op threads then wait on
    descheduled siblings and every timing inflates, the many-small-op linear paths far more than
    single-kernel sdpa."""
    other = machine.get("other_processes_cores")
    if other is None or other < 0.15:
        return None
    return (f"other processes kept {other:.2f} of {machine.get('usable_cores')} cores busy on average during the "
            "run: timings are inflated and unreliable; rerun on an idle machine")


def _load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


@contextlib.contextmanager
def measuring(threads=None):
    """Set torch's threads for a run (restored after) and yield the machine record, which gains
    the load at the end and how busy other processes kept the CPU."""
    saved = torch.get_num_threads()
    set_threads(threads)
    try:
        machine = machine_info()
        snapshot = cpu_snapshot()
        yield machine
        machine["load_average_end"] = _load_average()
        machine["other_processes_cores"] = other_processes_cores(snapshot, cpu_snapshot())
        machine["busy_warning"] = _busy_warning(machine)
    finally:
        torch.set_num_threads(saved)


# ---- measurement primitives ----------------------------------------------------------------------

def _timed(fn, placement=CPU):
    placement.synchronize()  # CUDA: earlier kernels are not this call's time
    start = placement.now()
    out = fn()
    placement.synchronize()  # CUDA: the call's kernels are queued, not done, when it returns
    elapsed = placement.now() - start
    del out
    return elapsed


@contextlib.contextmanager
def _quiet_stderr():
    """Silence the profiler backend's C++ log lines (written straight to file descriptor 2)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _memory_events(prof):
    """``[(time_ns, bytes)]`` of the CPU allocations (+) and frees (-) a profile recorded."""
    try:
        events = prof.profiler.kineto_results.events()
        found = [(e.start_ns(), e.nbytes()) for e in events
                 if e.name() == "[memory]" and "CPU" in str(e.device_type())]
        if found or not events:
            return found
    except (AttributeError, RuntimeError):
        pass
    import json

    with tempfile.TemporaryDirectory() as tmp:  # fall back on the exported trace
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        trace = json.loads(Path(path).read_text())
    return [(e.get("ts", 0), e["args"]["Bytes"]) for e in trace.get("traceEvents", [])
            if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0]


def peak_extra_memory(fn, placement=CPU):
    """Peak bytes allocated by PyTorch's CPU allocator while ``fn()`` runs (its output included).

    Allocations live before the call (inputs, weights) are not counted; every allocation and
    free during the call is, via ``torch.profiler`` memory profiling, and the peak of the running
    sum is returned. On CUDA: the device allocator's peak above the bytes allocated before
    (:meth:`linearize.placement.Placement.peak_extra_bytes`).
    """
    from torch.profiler import ProfilerActivity, profile

    if placement.is_cuda:
        return placement.peak_extra_bytes(fn)

    with _quiet_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn()
            del out
    running = peak = 0
    for _, nbytes in sorted(_memory_events(prof), key=lambda item: item[0]):
        running += nbytes
        peak = max(peak, running)
    return int(peak)


def _summary(seconds):
    ms = sorted(s * 1e3 for s in seconds)
    return {"median_ms": statistics.median(ms), "min_ms": ms[0], "max_ms": ms[-1], "runs": len(ms)}


def interleaved_times(candidates, repeats, warmup, placement=CPU):
    """Time every candidate ``warmup + repeats`` rounds, all candidates once per round, in an order
    rotated each round; return ``{label: [seconds of the timed rounds]}``."""
    labels = list(candidates)
    times = {label: [] for label in labels}
    for round_index in range(warmup + repeats):
        shift = round_index % max(len(labels), 1)
        for label in labels[shift:] + labels[:shift]:
            elapsed = _timed(candidates[label], placement)
            if round_index >= warmup:
                times[label].append(elapsed)
    return times


# ---- attention layer -----------------------------------------------------------------------------

def _measure(candidates, repeats, warmup, memory, reference, ratio_key, placement=CPU):
    """``{label: summary}`` of interleaved timings (and peak memory) with each time ÷ ``reference``'s."""
    with torch.inference_mode():
        times = interleaved_times(candidates, repeats, warmup, placement)
        peaks = {label: peak_extra_memory(fn, placement) for label, fn in candidates.items()} if memory else {}
    results = {}
    for label in candidates:
        entry = _summary(times[label])
        if memory:
            entry["peak_extra_bytes"] = peaks[label]
        results[label] = entry
    if reference in results:  # a reference skipped at this length (memory cap): no ratios
        base = results[reference]["median_ms"]
        for entry in results.values():
            entry[ratio_key] = entry["median_ms"] / base
    return results


def eager_softmax_attention(q, k, v, scale=None):
    """Softmax attention as explicit matrix products (Hugging Face's ``eager`` path)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    weights = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, dim=-1)
    return torch.matmul(weights, v)


def parse_method_list(text):
    """``"luna,luna(projections=16,shared_projections=false)"`` -> ``["luna", ("luna", {...})]``.

    Commas inside parentheses belong to the options; values are read as YAML scalars.
    """
    from .recipes import parse_options

    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise LinearizeError(f"unbalanced parentheses in {text!r} (example: luna,luna(projections=16))")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise LinearizeError(f"unbalanced parentheses in {text!r} (example: luna,luna(projections=16))")
    parts.append(current)
    specs = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        if "(" not in part:
            specs.append(part)
            continue
        name, _, inner = part.partition("(")
        if not inner.endswith(")"):
            raise LinearizeError(f"{part!r}: nothing may follow the options' ')' (example: luna(projections=16))")
        pairs = [item.strip() for item in inner[:-1].split(",") if item.strip()]
        specs.append((name.strip(), parse_options(pairs, example="luna(projections=16)")))
    return specs


def _method_specs(methods):
    """``[(label, method, options)]`` from names, ``(name, options)`` pairs or a ``{label: ...}`` dict."""
    from .attention.feature_maps import check_method_options
    from .attention.feature_maps import methods as registered

    if methods is None:
        methods = [name for name in registered() if name != "softmax"]
    if isinstance(methods, str):
        methods = parse_method_list(methods)
    items = methods.items() if isinstance(methods, dict) else [(None, m) for m in methods]
    specs = []
    for label, spec in items:
        name, options = (spec, {}) if isinstance(spec, str) else (spec[0], dict(spec[1]))
        check_method_options(name, options)  # before any timing: a typo fails at once
        label = label or (name if not options else name + "(" + ",".join(f"{k}={v}" for k, v in options.items()) + ")")
        if label in SOFTMAX_LABELS or label in [s[0] for s in specs]:
            raise LinearizeError(f"duplicate or reserved benchmark label {label!r}")
        specs.append((label, name, options))
    return specs


def _sdpa_candidates(q, k, v, placement):
    """SDPA as PyTorch dispatches it and, on CUDA, pinned to its flash and memory-efficient kernels
    (``{label: call}``, ``{label: why not}`` for a kernel that refuses this dtype or shape)."""
    candidates, skipped = {SDPA: lambda: F.scaled_dot_product_attention(q, k, v)}, {}
    if not placement.is_cuda:
        return candidates, skipped
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for label, backend in ((SDPA_FLASH, SDPBackend.FLASH_ATTENTION), (SDPA_EFFICIENT, SDPBackend.EFFICIENT_ATTENTION)):
        def pinned(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)
        try:
            with torch.inference_mode():
                pinned()
        except RuntimeError as error:  # e.g. flash attention has no float32 kernel
            skipped[label] = str(error).strip().splitlines()[0][:200]
            continue
        candidates[label] = pinned
    return candidates, skipped


def bench_attention(specs, seq_lens, *, batch_size=1, num_heads=12, head_dim=32, repeats=5, warmup=2,
                    memory=True, eager_max_bytes=8 * 2**30, seed=0, log=None, placement=CPU):
    """Attention-layer latency (and peak memory) of sdpa, eager softmax and each method per length,
    on ``placement``'s device and dtype (the feature maps keep float32 parameters: the attention
    computes features and sums in float32 and returns the input's dtype)."""
    from .attention.feature_maps import create_feature_map

    maps = {}
    for label, name, options in specs:
        torch.manual_seed(seed)
        maps[label] = create_feature_map(name, head_dim, num_heads, **options).eval().to(placement.device)
    rows = []
    for n in seq_lens:
        generator = torch.Generator().manual_seed(seed + int(n))
        q, k, v = (placement.tensor(torch.randn(batch_size, num_heads, int(n), head_dim, generator=generator))
                   for _ in range(3))
        candidates, skipped = _sdpa_candidates(q, k, v, placement)
        eager_bytes = 2 * batch_size * num_heads * int(n) ** 2 * q.element_size()  # scores + probabilities
        if eager_bytes <= eager_max_bytes:
            candidates[EAGER] = lambda: eager_softmax_attention(q, k, v)
        else:
            skipped[EAGER] = f"its two N×N matrices need {eager_bytes / 2**30:.1f} GiB > eager_max_bytes"
        for label, fm in maps.items():
            candidates[label] = (lambda fm: lambda: fm.attend(q, k, v)[0])(fm)
        row = {"seq_len": int(n), "skipped": skipped,
               "results": _measure(candidates, repeats, warmup, memory, SDPA, "time_vs_sdpa", placement)}
        rows.append(row)
        if log:
            parts = [f"{label} {entry['median_ms']:.2f}" for label, entry in row["results"].items()]
            log(f"attention N={n}: " + ", ".join(parts) + " ms (medians)")
        del q, k, v, candidates
    return rows


def crossover_point(points):
    """Where a method becomes faster than softmax, from ``[(N, time ÷ softmax time)]`` (any order).

    - ``measured``: the smallest measured N from which the method is faster (ratio < 1) at that
      and every longer measured N; for a ratio that falls with N (the usual case) this is the
      smallest measured N where it is faster. A faster point followed by a slower one (noise) is
      not a crossover. None: not faster at the longest measured N.
    - ``estimate``: the N where the ratio crosses 1 between the last slower measured point
      ``(N0, r0)`` (r0 ≥ 1) and ``measured`` ``(N1, r1)``, by linear interpolation of log r in
      log N: ``log N* = log N0 + t·(log N1 - log N0)`` with ``t = log r0 / (log r0 - log r1)``
      (rounded to a whole N). None when never faster or faster already at the first measured N.
    """
    points = sorted((int(n), float(r)) for n, r in points)
    if not points:
        return None
    measured = None
    for index, (n, ratio) in enumerate(points):
        if all(r < 1.0 for _, r in points[index:]):
            measured = n
            break
    estimate = None
    if measured is not None and measured != points[0][0]:
        index = [n for n, _ in points].index(measured)
        (n0, r0), (n1, r1) = points[index - 1], points[index]
        if r0 >= 1.0 > r1 and r1 > 0:
            t = math.log(r0) / (math.log(r0) - math.log(r1))
            estimate = round(math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0))))
    note = ("never faster in the measured range" if measured is None else
            f"faster from the first measured length ({measured}) on" if measured == points[0][0] else
            f"faster from N={measured} on")
    return {"measured": measured, "estimate": estimate, "faster_at_all_lengths": measured == points[0][0],
            "note": note}


def crossover_text(cross, unit="softmax"):
    """One line: where a method is faster than ``unit`` (from a :func:`crossover_point` dict)."""
    if not cross or cross.get("measured") is None:
        return f"not faster than {unit} at the longest measured length"
    if cross.get("faster_at_all_lengths"):
        return f"faster than {unit} at every measured length (from N = {cross['measured']:,})"
    estimate = f" (interpolated crossover N ≈ {cross['estimate']:,})" if cross.get("estimate") else ""
    return f"faster than {unit} from N = {cross['measured']:,} on{estimate}"


def crossovers(rows, labels, reference=SDPA):
    """Per label: :func:`crossover_point` of its time ÷ ``reference``'s time over the rows where
    both were measured (``measured``: the first length from which it stays faster; ``estimate``:
    the log-log interpolated N where the ratio crosses 1)."""
    out = {}
    for label in labels:
        points = [(row["seq_len"], row["results"][label]["median_ms"] / row["results"][reference]["median_ms"])
                  for row in rows if label in row["results"] and reference in row["results"]]
        if points:
            out[label] = crossover_point(points)
    return out


# ---- whole model ---------------------------------------------------------------------------------

def _load_model(model):
    if not isinstance(model, (str, os.PathLike)):
        return model
    from .convert.loading import load_source_model

    return load_source_model(str(model), head="sequence-classification", num_labels=2)


def _model_inputs(model, batch_size, n, seed):
    config = model.config
    vocab = int(getattr(config, "vocab_size", 1000))
    generator = torch.Generator().manual_seed(seed + n)
    low = min(1000, max(vocab // 4, 1))  # ordinary word pieces, past the special tokens
    ids = torch.randint(low, vocab, (batch_size, n), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones(batch_size, n, dtype=torch.long)}


def bench_model(model, specs, seq_lens, *, batch_size=1, repeats=5, warmup=2, memory=True, seed=0, log=None,
                placement=CPU):
    """Whole-model forward latency: softmax (own implementation and eager) against a converted copy
    per method, at each length the model accepts, every model on ``placement``'s device and dtype."""
    from .convert import convert

    from .convert.api import is_converted

    base = _load_model(model).eval()
    if is_converted(base):
        raise LinearizeError("bench_model needs the softmax model: this one is already converted (linearize.revert it)")
    implementation = getattr(base.config, "_attn_implementation", None) or "default"
    softmax_label = f"softmax ({implementation})"
    models = {softmax_label: base}
    if implementation != "eager" and hasattr(base, "set_attn_implementation"):
        eager = copy.deepcopy(base)
        try:
            eager.set_attn_implementation("eager")
            models["softmax (eager)"] = eager.eval()
        except (ValueError, RuntimeError):
            pass
    for label, name, options in specs:
        converted = copy.deepcopy(base)
        torch.manual_seed(seed)
        models[label] = convert(converted, name, **options).eval()
    for candidate in models.values():
        placement.model(candidate)
    limit = getattr(base.config, "max_position_embeddings", None)
    rows = []
    for n in seq_lens:
        n = int(n)
        if limit is not None and n > int(limit):
            if log:
                log(f"model N={n}: skipped (longer than max_position_embeddings={limit})")
            continue
        batch = placement.batch(_model_inputs(base, batch_size, n, seed))
        candidates = {label: (lambda m: lambda: m(**batch))(m) for label, m in models.items()}
        row = {"seq_len": n,
               "results": _measure(candidates, repeats, warmup, memory, softmax_label, "time_vs_softmax", placement)}
        rows.append(row)
        if log:
            parts = [f"{label} {entry['median_ms']:.2f}" for label, entry in row["results"].items()]
            log(f"model N={n}: " + ", ".join(parts) + " ms (medians)")
    info = {
        "name": getattr(base.config, "_name_or_path", None) or type(base).__name__,
        "architecture": type(base).__name__,
        "model_type": getattr(base.config, "model_type", None),
        "num_layers": getattr(base.config, "num_hidden_layers", None),
        "hidden_size": getattr(base.config, "hidden_size", None),
        "num_heads": getattr(base.config, "num_attention_heads", None),
        "parameters": int(sum(p.numel() for p in base.parameters())),
        "softmax_label": softmax_label,
    }
    return info, rows


# ---- targets, report, plot -----------------------------------------------------------------------

def _targets(attention_rows, labels, model_rows, model_labels, softmax_label):
    targets = {}
    row = next((r for r in attention_rows if r["seq_len"] == ATTENTION_TARGET["seq_len"]), None)
    if row is not None:
        per = {}
        for label in labels:
            speedup = row["results"][SDPA]["median_ms"] / row["results"][label]["median_ms"]
            per[label] = {"speedup_vs_sdpa": speedup, "met": speedup >= ATTENTION_TARGET["min_speedup"]}
        targets["attention"] = {**ATTENTION_TARGET, "methods": per, "all_met": all(p["met"] for p in per.values())}
    row = next((r for r in model_rows if r["seq_len"] == MODEL_TARGET["seq_len"]), None)
    if row is not None:
        per = {}
        for label in model_labels:
            ratio = row["results"][label]["time_vs_softmax"]
            per[label] = {"time_vs_softmax": ratio, "met": ratio <= MODEL_TARGET["max_ratio"]}
        targets["model"] = {**MODEL_TARGET, "reference": softmax_label, "methods": per,
                            "all_met": all(p["met"] for p in per.values())}
    return targets


def _mib(nbytes):
    return "—" if nbytes is None else f"{nbytes / 2**20:.1f}"


def _softmax_labels(rows):
    """The softmax columns: sdpa, its pinned CUDA kernels where measured, eager."""
    return [label for label in SOFTMAX_LABELS
            if label in (SDPA, EAGER) or any(label in row["results"] for row in rows)]


def markdown_report(result):
    """The tables of ``bench.md``."""
    lines = _header_lines(result["config"], result["machine"])
    lines += _attention_tables(result["attention"], _softmax_labels(result["attention"]) + result["methods"])
    lines += ["", "## Crossover against sdpa", "", "| method | faster from N | estimated crossover N |", "|---|---:|---:|"]
    for label, cross in result["crossover"].items():
        measured = "never" if cross["measured"] is None else (
            f"≤ {cross['measured']}" if cross["faster_at_all_lengths"] else str(cross["measured"]))
        lines.append(f"| {label} | {measured} | {cross['estimate'] or '—'} |")
    if result.get("model"):
        lines += _model_tables(result["model"])
    if result.get("targets"):
        lines += _target_lines(result["targets"])
    return "\n".join(lines) + "\n"


def _markdown_table(rows, labels, cell):
    """A table with one line per measured length and one column per label: ``cell(row, label)``."""
    lines = ["| N | " + " | ".join(labels) + " |", "|---:|" + "---:|" * len(labels)]
    return lines + [f"| {row['seq_len']} | " + " | ".join(cell(row, label) for label in labels) + " |" for row in rows]


def _has_memory(rows):
    return any("peak_extra_bytes" in entry for row in rows for entry in row["results"].values())


def _header_lines(cfg, machine):
    return [
        "# linearize benchmark: linear attention against softmax", "",
        f"Machine: {machine['cpu_model']}, {machine['usable_cores']} usable cores, torch {machine['torch']}, "
        f"{machine['torch_threads']} threads; load average at start {machine['load_average_start']}, "
        f"at end {machine.get('load_average_end')}; other processes used "
        f"{machine.get('other_processes_cores')} cores on average during the run.",
        *([f"**Warning: {machine['busy_warning']}.**"] if machine.get("busy_warning") else []),
        f"Attention layer: batch {cfg['batch_size']}, {cfg['num_heads']} heads, head dim {cfg['head_dim']}, "
        f"{cfg.get('placement', 'cpu, float32')}, no padding; {cfg['warmup']} warm-up + {cfg['repeats']} timed "
        f"rounds, candidates interleaved; medians in ms of "
        f"{'process CPU time' if cfg.get('clock') == 'cpu' else 'wall-clock time'}. ×sdpa = sdpa time / method "
        "time (above 1: faster than sdpa).",
        "Peak memory: extra MiB allocated during one forward, output included (CPU: PyTorch's allocator through "
        "torch.profiler memory events; CUDA: torch.cuda.max_memory_allocated).", ""]


def _attention_tables(rows, labels):
    def latency(row, label):
        entry = row["results"].get(label)
        if entry is None:
            return "skipped"
        if label == SDPA:
            return f"{entry['median_ms']:.2f}"
        return f"{entry['median_ms']:.2f} ({1 / entry['time_vs_sdpa']:.2f}×)"

    def memory(row, label):
        return _mib(row["results"][label].get("peak_extra_bytes")) if label in row["results"] else "skipped"

    lines = ["## Attention layer: median latency (ms)", "", *_markdown_table(rows, labels, latency)]
    if _has_memory(rows):
        lines += ["", "## Attention layer: peak extra memory (MiB)", "", *_markdown_table(rows, labels, memory)]
    return lines


def _model_tables(model):
    rows, info = model["rows"], model["info"]
    labels = list(rows[0]["results"]) if rows else []

    def latency(row, label):
        entry = row["results"][label]
        return f"{entry['median_ms']:.2f} ({entry['time_vs_softmax']:.2f})"

    lines = ["", f"## Whole model: {info['name']} ({info['architecture']}), median forward ms", "",
             f"Ratio in brackets: time / {info['softmax_label']} time (below 1: faster).", "",
             *_markdown_table(rows, labels, latency)]
    lines += ["", "Whole model, crossover:", ""] + [
        f"- {label}: {crossover_text(cross, info['softmax_label'])}" for label, cross in model.get("crossover", {}).items()]
    if _has_memory(rows):
        lines += ["", "Whole model: peak extra memory (MiB) of one forward", "",
                  *_markdown_table(rows, labels, lambda row, label: _mib(row["results"][label].get("peak_extra_bytes")))]
    return lines


def _target_lines(targets):
    lines = ["", "## Targets", ""]
    att = targets.get("attention")
    if att:
        lines.append(f"- attention layer at N={att['seq_len']}, every method ≥ {att['min_speedup']}× faster than "
                     f"sdpa: {'met' if att['all_met'] else 'NOT met'} ("
                     + ", ".join(f"{k} {v['speedup_vs_sdpa']:.1f}×" for k, v in att["methods"].items()) + ")")
    mod = targets.get("model")
    if mod:
        lines.append(f"- whole model at N={mod['seq_len']}, converted no slower than {mod['reference']}: "
                     f"{'met' if mod['all_met'] else 'NOT met'} ("
                     + ", ".join(f"{k} {v['time_vs_softmax']:.2f}" for k, v in mod["methods"].items()) + ")")
    return lines


def plot(result):
    """PNG bytes of the log-log plots: attention time and memory against N (and the model)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = result["attention"]
    has_memory = any("peak_extra_bytes" in e for row in rows for e in row["results"].values())
    model_rows = (result.get("model") or {}).get("rows") or []
    panels = 1 + has_memory + bool(model_rows)
    fig = Figure(figsize=(6.2 * panels, 5.2))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, panels, i + 1) for i in range(panels)]
    _attention_panels(axes[: 1 + has_memory], rows, _softmax_labels(rows) + result["methods"])
    if model_rows:
        _model_panel(axes[-1], model_rows, result["model"]["info"])
    cfg = result["config"]
    where = (cfg["placement"] if str(cfg.get("device", "cpu")).startswith("cuda") else
             f"{result['machine']['torch_threads']} threads, {result['machine']['cpu_model']}")
    fig.suptitle(f"linearize: batch {cfg['batch_size']}, {cfg['num_heads']} heads × {cfg['head_dim']}, {where}",
                 fontsize=9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def _attention_panels(axes, rows, labels):
    """The attention layer's median latency (``axes[0]``) and, with a second axis, its peak extra
    memory against N, log-log, one line per label (softmax in black)."""
    styles = {SDPA: dict(color="black", linewidth=2.5), EAGER: dict(color="black", linewidth=2, linestyle="--")}
    for label in labels:
        points = [(row["seq_len"], row["results"][label]) for row in rows if label in row["results"]]
        if not points:
            continue
        style = styles.get(label, dict(linewidth=1.3, marker="o", markersize=3))
        axes[0].plot([n for n, _ in points], [e["median_ms"] for _, e in points], label=label, **style)
        if len(axes) > 1:
            axes[1].plot([n for n, _ in points], [max(e.get("peak_extra_bytes", 0), 1) / 2**20 for _, e in points],
                         label=label, **style)
    axes[0].set_title("attention layer: median latency")
    axes[0].set_ylabel("ms")
    if len(axes) > 1:
        axes[1].set_title("attention layer: peak extra memory")
        axes[1].set_ylabel("MiB")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)


def _model_panel(ax, model_rows, info):
    """Bars of the whole model's time ÷ softmax's, one group per model, one bar per length."""
    labels = list(model_rows[0]["results"])
    width = 0.8 / max(len(model_rows), 1)
    for i, row in enumerate(model_rows):
        reference = row["results"][info["softmax_label"]]["median_ms"]
        ax.bar([j + i * width for j in range(len(labels))], [row["results"][m]["time_vs_softmax"] for m in labels],
               width=width, label=f"N={row['seq_len']} ({reference:.1f} ms = 1)")
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks([j + width * (len(model_rows) - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"median forward time / {info['softmax_label']}")
    ax.set_title(f"whole model forward: {info['architecture']}")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)


def _atomic_write_bytes(path, data):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---- entry point ---------------------------------------------------------------------------------

def _method_notes(placement, clock):
    """How ``bench.json``'s times and memory were taken (its ``config``)."""
    return {"timing": f"{'wall clock' if clock == 'wall' else 'process CPU time'} per forward under "
                      "torch.inference_mode; candidates interleaved (order rotated each round); medians of the "
                      "timed rounds",
            "memory_method": "CUDA: torch.cuda.max_memory_allocated during one separate forward minus the bytes "
                             "allocated before it" if placement.is_cuda else
                             "peak of the running sum of torch.profiler CPU allocation events during one separate "
                             "forward (output included, inputs/weights excluded; oneDNN/BLAS scratch not counted)"}


def run_bench(out_dir, methods=None, seq_lens=DEFAULT_SEQ_LENS, batch_size=1, num_heads=12, head_dim=32,
              threads=None, repeats=5, warmup=2, model=None, model_seq_lens=DEFAULT_MODEL_SEQ_LENS, *,
              memory=True, eager_max_bytes=8 * 2**30, seed=0, log=print, device="cpu", dtype="fp32", clock="wall"):
    """Benchmark linear attention against softmax; write ``bench.json``, ``bench.md``, ``bench.png``.

    ``methods``: method names (default: every registered method but ``softmax``), ``(name,
    options)`` pairs, or ``{label: name or (name, options)}``. ``threads``: torch intra-op threads
    for the run (restored after; default: leave as is). ``model``: a Hugging Face model, or a
    name/folder for ``linearize.convert.loading.load_source_model`` (e.g. ``"minilm"``), or None
    to skip the whole-model part. ``memory``: also profile peak memory. ``log``: a callable for
    progress lines (None: silent). ``device`` (``cpu``, ``cuda``) and ``dtype`` (``fp32``, ``bf16``,
    ``fp16``): where and in what precision everything runs (:class:`linearize.placement.Placement`);
    on CUDA, SDPA's flash and memory-efficient kernels are measured beside its dispatch. ``clock``:
    ``"wall"`` (default) or ``"cpu"`` (the process's CPU time: with ``threads=1``, robust to other
    processes on a shared machine).

    Returns the dict written to ``bench.json``: ``machine``, ``config``, ``methods``,
    ``attention`` (one row per length: ``results[label]`` with ``median_ms``, ``min_ms``,
    ``max_ms``, ``runs``, ``time_vs_sdpa``, ``peak_extra_bytes``), ``crossover`` (per method),
    ``model`` (``info`` and ``rows``) and ``targets``, plus ``files``.
    """
    out_dir = Path(out_dir)
    seq_lens = [int(n) for n in seq_lens]
    model_seq_lens = [int(n) for n in model_seq_lens or ()]
    if repeats < 1 or warmup < 0:
        raise LinearizeError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    if not seq_lens or min(seq_lens) < 1:
        raise LinearizeError(f"seq_lens must be positive lengths, got {seq_lens}")
    specs = _method_specs(methods)
    placement = Placement.parse(device, dtype, clock)  # a bad device, dtype or clock fails before any timing
    labels = [label for label, _, _ in specs]
    with measuring(threads) as machine:
        started = time.time()
        attention = bench_attention(specs, seq_lens, batch_size=batch_size, num_heads=num_heads, head_dim=head_dim,
                                    repeats=repeats, warmup=warmup, memory=memory, eager_max_bytes=eager_max_bytes,
                                    seed=seed, log=log, placement=placement)
        model_part = None
        if model is not None and model_seq_lens:
            info, rows = bench_model(model, specs, model_seq_lens, batch_size=batch_size, repeats=repeats,
                                     warmup=warmup, memory=memory, seed=seed, log=log, placement=placement)
            model_part = {"info": info, "rows": rows, "crossover": crossovers(rows, labels, info["softmax_label"])}
    config = {"seq_lens": seq_lens, "batch_size": batch_size, "num_heads": num_heads, "head_dim": head_dim,
              **placement.record(), "repeats": repeats, "warmup": warmup, "memory": memory,
              "eager_max_bytes": eager_max_bytes, "seed": seed, "model_seq_lens": model_seq_lens,
              "methods": {label: {"method": name, "options": options} for label, name, options in specs},
              **_method_notes(placement, clock)}
    result = {"machine": machine, "config": config, "methods": labels, "attention": attention,
              "crossover": crossovers(attention, labels), "model": model_part,
              "elapsed_s": round(time.time() - started, 1)}
    result["targets"] = _targets(attention, labels, model_part["rows"] if model_part else [],
                                 list(labels) if model_part else [],
                                 model_part["info"]["softmax_label"] if model_part else None)
    files = {"json": str(out_dir / "bench.json"), "markdown": str(out_dir / "bench.md"),
             "plot": str(out_dir / "bench.png")}
    result["files"] = files
    _atomic_write_bytes(files["plot"], plot(result))
    atomic_write_text(files["markdown"], markdown_report(result))
    atomic_write_json(files["json"], result)
    if log:
        if result["machine"].get("busy_warning"):
            log("warning: " + result["machine"]["busy_warning"])
        for label, cross in result["crossover"].items():
            log(f"crossover {label}: {cross['note']}" + (f" (estimated N≈{cross['estimate']})" if cross["estimate"] else ""))
        log(f"wrote {files['json']}, {files['markdown']}, {files['plot']}")
    return result
