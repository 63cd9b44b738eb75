"""Speed and memory of linear attention against softmax attention, measured side by side
(``linearize bench attention``).

``run_bench(out_dir, ...)`` measures, in one process and one run:

1. **Attention layer** (MiniLM geometry by default: batch 1, 12 heads, head dim 32), for every
   sequence length: softmax through PyTorch's ``F.scaled_dot_product_attention`` ("sdpa", the
   best softmax path on CPU), eager softmax (``softmax(QKᵀ·scale)·V`` as explicit matmuls, what
   Hugging Face's ``eager`` implementation does), and each method's linear path
   (``FeatureMap.attend``, i.e. :func:`linearize.attention.linear_attention`).
2. **Whole model** (optional): the forward of a Hugging Face model at its own lengths, softmax
   (the model's own attention implementation, and eager) against a converted deep copy per
   method (:func:`linearize.bench.bench_model`).

How it is measured (:mod:`linearize.bench.timing`): latency of one forward under
``torch.inference_mode``, candidates interleaved with their order rotated each round, medians;
peak extra memory of a separate, untimed forward (CPU: ``torch.profiler``'s allocation events;
CUDA: ``torch.cuda.max_memory_allocated``). Eager softmax is skipped where its two N×N matrices
would exceed ``eager_max_bytes``.

Outputs in ``out_dir``: ``bench.json`` (all numbers, machine info, crossovers; written
atomically), ``bench.md`` (tables) and ``bench.png`` (log-log time and memory against N).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..config import MeasureConfig
from ..errors import LinearizeError
from ..outputs import atomic_write_bytes, atomic_write_json, atomic_write_text, writes_output
from .crossover import crossovers
from .methods import EAGER, SDPA, SDPA_EFFICIENT, SDPA_FLASH, method_specs
from .models import bench_model
from .plots import plot
from .tables import markdown_report
from .timing import CPU, checked_placement, loop_settings, measure_candidates, measuring

DEFAULT_SEQ_LENS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_MODEL_SEQ_LENS = (128, 512)
#: the targets of the benchmark issue (speedup of every method over sdpa at one length)
ATTENTION_TARGET = {"seq_len": 4096, "min_speedup": 4.0}
MODEL_TARGET = {"seq_len": 512, "max_ratio": 1.0}


def eager_softmax_attention(q, k, v, scale=None):
    """Softmax attention as explicit matrix products (Hugging Face's ``eager`` path)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    weights = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, dim=-1)
    return torch.matmul(weights, v)


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
    from ..attention.feature_maps import create_feature_map

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
               "results": measure_candidates(candidates, repeats, warmup, memory, SDPA, "time_vs_sdpa", placement)}
        rows.append(row)
        if log:
            parts = [f"{label} {entry['median_ms']:.2f}" for label, entry in row["results"].items()]
            log(f"attention N={n}: " + ", ".join(parts) + " ms (medians)")
        del q, k, v, candidates
    return rows


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


def _method_notes(placement, clock):
    """How ``bench.json``'s times and memory were taken (its ``config``)."""
    return {"timing": f"{'wall clock' if clock == 'wall' else 'process CPU time'} per forward under "
                      "torch.inference_mode; candidates interleaved (order rotated each round); medians of the "
                      "timed rounds",
            "memory_method": "CUDA: torch.cuda.max_memory_allocated during one separate forward minus the bytes "
                             "allocated before it" if placement.is_cuda else
                             "peak of the running sum of torch.profiler CPU allocation events during one separate "
                             "forward (output included, inputs/weights excluded; oneDNN/BLAS scratch not counted)"}


def _write_bench(result, out_dir, log):
    """Write ``bench.png``, ``bench.md`` and ``bench.json`` (each atomically) into ``out_dir``; log
    the crossovers."""
    files = {"json": str(out_dir / "bench.json"), "markdown": str(out_dir / "bench.md"),
             "plot": str(out_dir / "bench.png")}
    result["files"] = files
    atomic_write_bytes(files["plot"], plot(result))
    atomic_write_text(files["markdown"], markdown_report(result))
    atomic_write_json(files["json"], result)
    if log:
        if result["machine"].get("busy_warning"):
            log("warning: " + result["machine"]["busy_warning"])
        for label, cross in result["crossover"].items():
            log(f"crossover {label}: {cross['note']}" + (f" (estimated N≈{cross['estimate']})" if cross["estimate"] else ""))
        log(f"wrote {files['json']}, {files['markdown']}, {files['plot']}")


@writes_output("out_dir")
def run_bench(out_dir, methods=None, seq_lens=DEFAULT_SEQ_LENS, num_heads=12, head_dim=32, model=None,
              model_seq_lens=DEFAULT_MODEL_SEQ_LENS, *, measure: MeasureConfig | None = None,
              eager_max_bytes=8 * 2**30, seed=0, log=print):
    """Benchmark linear attention against softmax; write ``bench.json``, ``bench.md``, ``bench.png``.

    ``methods``: method names (default: every registered method but ``softmax``), ``(name,
    options)`` pairs, or ``{label: name or (name, options)}``. ``model``: a Hugging Face model, or a
    name/folder for ``linearize.convert.loading.load_source_model`` (e.g. ``"minilm"``), or None
    to skip the whole-model part. ``log``: a callable for progress lines (None: silent).
    ``measure``: how to measure (:class:`linearize.config.MeasureConfig`; None: its defaults, batch 1,
    5 repeats after 2 warm-up rounds, peak memory too, fp32 on the CPU by the wall clock, torch's
    threads left as they are). Its ``device`` and ``dtype`` say where and in what precision everything
    runs (:class:`linearize.bench.Placement`); on CUDA, SDPA's flash and memory-efficient kernels are
    measured beside its dispatch; ``clock="cpu"`` with ``threads=1`` is robust to other processes on
    a shared machine. Everything runs in this process: ``processes`` and ``compile_mode`` are refused
    (they are :func:`linearize.bench.run_long_bench`'s and :func:`linearize.bench.bench_folder`'s).

    Returns the dict written to ``bench.json``: ``machine``, ``config``, ``methods``,
    ``attention`` (one row per length: ``results[label]`` with ``median_ms``, ``min_ms``,
    ``max_ms``, ``runs``, ``time_vs_sdpa``, ``peak_extra_bytes``), ``crossover`` (per method),
    ``model`` (``info`` and ``rows``) and ``targets``, plus ``files``.
    """
    seq_lens = [int(n) for n in seq_lens]
    model_seq_lens = [int(n) for n in model_seq_lens or ()]
    measure = MeasureConfig() if measure is None else measure
    placement = checked_placement(measure)  # a bad setting fails before any timing
    if measure.processes or measure.compile_mode is not None:
        raise LinearizeError("run_bench times in this process: processes and compile_mode are for run_long_bench "
                             "and bench_folder (linearize bench long | folder)")
    if not seq_lens or min(seq_lens) < 1:
        raise LinearizeError(f"seq_lens must be positive lengths, got {seq_lens}")
    specs = method_specs(methods)
    labels = [label for label, _, _ in specs]
    timed = dict(loop_settings(measure), seed=seed, log=log, placement=placement)
    with measuring(measure.threads) as machine:
        started = time.time()
        attention = bench_attention(specs, seq_lens, num_heads=num_heads, head_dim=head_dim,
                                    eager_max_bytes=eager_max_bytes, **timed)
        model_part = None
        if model is not None and model_seq_lens:
            info, rows = bench_model(model, specs, model_seq_lens, **timed)
            model_part = {"info": info, "rows": rows, "crossover": crossovers(rows, labels, info["softmax_label"])}
    config = {"seq_lens": seq_lens, "batch_size": measure.batch_size, "num_heads": num_heads, "head_dim": head_dim,
              **placement.record(), "repeats": measure.repeats, "warmup": measure.warmup, "memory": measure.memory,
              "eager_max_bytes": eager_max_bytes, "seed": seed, "model_seq_lens": model_seq_lens,
              "methods": {label: {"method": name, "options": options} for label, name, options in specs},
              **_method_notes(placement, measure.clock)}
    result = {"machine": machine, "config": config, "methods": labels, "attention": attention,
              "crossover": crossovers(attention, labels), "model": model_part,
              "elapsed_s": round(time.time() - started, 1)}
    result["targets"] = _targets(attention, labels, model_part["rows"] if model_part else [],
                                 list(labels) if model_part else [],
                                 model_part["info"]["softmax_label"] if model_part else None)
    _write_bench(result, Path(out_dir), log)
    return result
