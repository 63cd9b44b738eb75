"""Whole converted models against softmax at long lengths, and the crossover a user can see.

Two measurements, both timed and profiled with :mod:`linearize.bench`'s primitives (candidates
interleaved, order rotated each round, medians; peak extra memory from ``torch.profiler``):

1. ``run_long_bench(out_dir, ...)`` (``linearize bench --long``): for each model geometry — by
   default all-MiniLM-L6-v2 (real weights, its 512 learned positions extended by
   ``linearize.convert(..., max_length=N)``'s tiling) and the ModernBERT-base geometry
   (``transformers.ModernBertConfig()`` defaults, random weights: only time and memory mean
   anything) — the whole model's forward at 512 … 16,384 tokens, softmax (the model's own SDPA
   attention, positions extended the same way) against one converted copy per method. A method
   ``linearize.convert`` refuses on a model is recorded with convert's reason, not measured;
   softmax is skipped where its N×N matrices would pass a memory cap. Per method: time ratios,
   the crossover length (:func:`linearize.bench.crossover_point`) and, for Hedgehog and the
   default recipe's LUNA, the issue's targets (:data:`LONG_TARGETS`) as pass/miss.
2. ``bench_folder(directory, ...)`` (``linearize bench --model DIR``): a converted model folder
   against its own softmax original (the same weights with ``linearize.revert``) at 128, 512 and
   2,048 tokens (lengths past the model's positions are skipped with the reason); the result,
   with the machine it was measured on, is written atomically to ``DIR/bench.json``, which
   ``linearize info DIR`` and the model card (``linearize push``) state.
"""

from __future__ import annotations

import copy
import datetime
import json
import time
from pathlib import Path

import torch

from .bench import _measure, _method_specs, _model_inputs, crossover_text, crossovers, machine_info, measuring
from .errors import LinearizeError
from .io import atomic_write_json, atomic_write_text
from .placement import CPU, Placement

DEFAULT_LONG_SEQ_LENS = (512, 2048, 4096, 8192, 16384)
DEFAULT_FOLDER_SEQ_LENS = (128, 512, 2048)
DEFAULT_GEOMETRIES = ("minilm", "modernbert-base")
#: label of the default recipe's LUNA (its options are read from the recipe, not copied here)
RECIPE_LUNA = "luna (recipe)"
#: issue 19's whole-model targets: N -> minimum speed-up (softmax time ÷ method time), for
#: Hedgehog and the default recipe's LUNA
LONG_TARGETS = {2048: 1.5, 4096: 2.5, 8192: 4.0}
#: the file ``bench_folder`` writes into a converted model folder
FOLDER_BENCH_JSON = "bench.json"
LONG_FILES = ("bench-long.json", "bench-long.md")
#: how the crossover is computed (:func:`linearize.bench.crossover_point`), stated in every output
CROSSOVER_RULE = ("the smallest measured N from which the converted model is faster than softmax at every longer "
                  "measured N; the interpolated N is where the time ratio crosses 1 when log(ratio) is taken as "
                  "linear in log N between the last slower and the first faster measured length")
GEOMETRY_NOTES = {
    "minilm": "all-MiniLM-L6-v2 (pretrained weights), 512 learned positions extended by linearize.convert's tiling",
    "modernbert-base": "ModernBERT-base geometry (transformers' ModernBertConfig defaults: hidden 768, 22 layers, "
                       "12 heads, intermediate 1152, 8,192 rotary positions, sliding window of 128 on 2 of every "
                       "3 layers), random weights",
}


# ---- what is measured ----------------------------------------------------------------------------

def recipe_luna():
    """``("luna", options)`` of the default recipe (``linearize/recipes/minilm-moviereviews.yaml``)."""
    from .recipes import DEFAULT_RECIPE, load_recipe, options_for

    recipe = load_recipe(DEFAULT_RECIPE)
    return recipe["method"], options_for(recipe["method"], recipe["options"])


def default_long_methods():
    """``{label: method or (method, options)}``: the recipe's LUNA, LUNA's defaults, Hedgehog, T2R,
    DARKFormer, Performer and Flexformer-n."""
    return {RECIPE_LUNA: recipe_luna(), "luna": "luna", "hedgehog": "hedgehog", "t2r": "t2r",
            "darkformer": "darkformer", "performer": "performer", "flexformer-n": "flexformer-n"}


def target_labels(specs):
    """The labels the targets apply to: Hedgehog with its defaults and the recipe's LUNA."""
    luna = recipe_luna()
    return [label for label, name, options in specs
            if (name, options) in (("hedgehog", {}), (luna[0], luna[1]))]


def geometry_model(name, seed=0):
    """The softmax model of a geometry: ``modernbert-base`` (random weights), or any name
    ``linearize.convert.load_source_model`` loads (``minilm``, a folder, a Hub id)."""
    import transformers

    if name == "modernbert-base":
        torch.manual_seed(seed)
        model = transformers.ModernBertModel(transformers.ModernBertConfig())
        model.config._name_or_path = "ModernBERT-base geometry (random weights)"
        return model.eval()
    from .convert import load_source_model

    return load_source_model(name).eval()


def learned_positions(model):
    """The length of a model's learned absolute position table, or None (rotary, sinusoidal, none)."""
    from .convert.positions import max_positions

    try:
        return max_positions(model)
    except LinearizeError:
        return None


def accepted_length(model):
    """The longest input a model takes as it is: its learned positions, else its config's limit."""
    return learned_positions(model) or getattr(model.config, "max_position_embeddings", None)


def default_softmax_max_bytes(placement=CPU):
    """Half the GPU's memory on CUDA, else half the machine's physical memory (16 GiB where it
    cannot be read)."""
    if placement.is_cuda:
        return placement.memory_bytes() // 2
    memory_gib = machine_info().get("memory_gib")
    return int((memory_gib or 32) / 2 * 2**30)


def softmax_bytes(model, batch_size, n):
    """``(bytes, what)``: the N×N memory one softmax attention layer of ``model`` needs at length ``n``.

    Eager attention holds the scores and the probabilities, ``2·batch·heads·N²·4`` bytes. SDPA on
    CPU runs PyTorch's fused kernel block by block (a one-layer BERT with 12 heads at N = 2,048
    allocated 15.6 MiB, against 384 MiB for the two matrices), so only the attention mask
    transformers may build remains, at most ``batch·N²·4`` bytes.
    """
    if getattr(model.config, "_attn_implementation", None) == "eager":
        heads = int(getattr(model.config, "num_attention_heads", 1))
        return 2 * batch_size * heads * n * n * 4, "eager attention's N×N scores and probabilities"
    return batch_size * n * n * 4, "SDPA's N×N attention mask"


def softmax_skip_reason(model, batch_size, n, max_bytes):
    """Why softmax is not run at length ``n`` (None: it is): :func:`softmax_bytes` exceeds ``max_bytes``."""
    need, what = softmax_bytes(model, batch_size, n)
    if need <= max_bytes:
        return None
    return f"{what} would take {_size(need)} > the cap of {_size(max_bytes)} (--softmax-max-gib)"


def _size(nbytes):
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**29 else f"{nbytes / 2**20:.1f} MiB"


def model_info(model, softmax_label):
    config = model.config
    return {"name": getattr(config, "_name_or_path", None) or type(model).__name__,
            "architecture": type(model).__name__, "model_type": getattr(config, "model_type", None),
            "num_layers": getattr(config, "num_hidden_layers", None),
            "hidden_size": getattr(config, "hidden_size", None),
            "num_heads": getattr(config, "num_attention_heads", None),
            "parameters": int(sum(p.numel() for p in model.parameters())), "softmax_label": softmax_label}


def measure_lengths(models, reference, seq_lens, *, batch_size=1, repeats=5, warmup=2, memory=True,
                    softmax_max_bytes=None, capped=None, seed=0, log=None, placement=CPU):
    """One row per length: every model of ``{label: model}`` timed (and profiled) side by side,
    ``time_vs_softmax`` against ``reference``'s label. The labels of ``capped`` (default: the
    reference; every model that keeps a softmax layer belongs there) are skipped, with the reason
    in ``skipped``, where :func:`softmax_skip_reason` says so. Models and inputs go to
    ``placement``'s device and dtype."""
    for model in models.values():
        placement.model(model)
    first = models[reference]
    capped = {reference} if capped is None else set(capped)
    rows = []
    for n in (int(n) for n in seq_lens):
        batch = placement.batch(_model_inputs(first, batch_size, n, seed))
        reason = None if softmax_max_bytes is None else softmax_skip_reason(first, batch_size, n, softmax_max_bytes)
        skipped = {label: reason for label in models if reason and label in capped}
        candidates = {label: (lambda m: lambda: m(**batch))(m) for label, m in models.items() if label not in skipped}
        results = (_measure(candidates, repeats, warmup, memory, reference, "time_vs_softmax", placement)
                   if candidates else {})
        rows.append({"seq_len": n, "results": results, "skipped": skipped})
        if log:
            parts = [f"{label} {entry['median_ms']:.1f}" for label, entry in results.items()]
            log(f"model N={n}: " + ", ".join(parts) + " ms (medians)" +
                (f"; skipped: {', '.join(skipped)}" if skipped else ""))
        del batch, candidates
    return rows


# ---- 1. whole models at long lengths ---------------------------------------------------------------

def converted_copies(base, specs, max_length, seed=0, convert_sliding_window=False):
    """``(models, refused, layers, partial)``: a converted deep copy of ``base`` per method spec
    (positions extended to ``max_length`` by ``convert`` where given; sliding-window layers converted
    to windowed linear attention with ``convert_sliding_window``), convert's reason for each
    method it refuses, the attention layers each conversion converted, and the labels of the
    conversions that left some attention layers softmax (e.g. sliding-window layers)."""
    from .convert import convert, linearize_config

    models, refused, layers, partial = {}, {}, {}, []
    for label, name, options in specs:
        candidate = copy.deepcopy(base)
        torch.manual_seed(seed)
        try:
            convert(candidate, name, max_length=max_length, convert_sliding_window=convert_sliding_window, **options)
        except LinearizeError as error:
            refused[label] = str(error)
            continue
        models[label] = candidate.eval()
        block = linearize_config(candidate) or {}
        layers[label] = list(block.get("layers") or [])
        if len(layers[label]) < (block.get("num_attention_layers") or 0):
            partial.append(label)
    return models, refused, layers, partial


def bench_geometry(name, base, specs, seq_lens, *, batch_size=1, repeats=5, warmup=2, memory=True,
                   softmax_max_bytes=None, seed=0, log=None, placement=CPU, convert_sliding_window=False):
    """One geometry's entry of ``bench-long.json``: info, refused methods, rows, crossovers, targets."""
    from .convert.positions import extend_positions

    base = base.eval()
    longest, learned = max(seq_lens), learned_positions(base)
    extend = longest if learned is not None and longest > learned else None
    softmax = copy.deepcopy(base)
    if extend is not None:
        extend_positions(softmax, extend)
    softmax_label = f"softmax ({getattr(base.config, '_attn_implementation', None) or 'default'})"
    models, refused, layers, partial = converted_copies(base, specs, extend, seed, convert_sliding_window)
    for label, reason in refused.items():
        if log:
            log(f"{name}: {label} not measured: {reason}")
    limit = getattr(base.config, "max_position_embeddings", None)
    info = {**model_info(base, softmax_label), "geometry": GEOMETRY_NOTES.get(name, name),
            "positions": {"learned": learned, "extended_to": extend, "config_limit": limit},
            "converted_layers": layers, "keeps_softmax_layers": partial}
    if learned is None and limit is not None and longest > int(limit):
        info["positions"]["note"] = (f"lengths past config.max_position_embeddings={limit} run on positions that "
                                     "are not a learned table (ModernBERT's rotary positions: computed for any N)")
    rows = measure_lengths({softmax_label: softmax, **models}, softmax_label, seq_lens, batch_size=batch_size,
                           repeats=repeats, warmup=warmup, memory=memory, softmax_max_bytes=softmax_max_bytes,
                           capped=[softmax_label, *partial], seed=seed, placement=placement,
                           log=log and (lambda line: log(f"{name}: {line}")))
    labels = list(models)
    return {"geometry": name, "info": info, "methods": labels, "refused": refused, "rows": rows,
            "crossover": crossovers(rows, labels, softmax_label),
            "targets": long_targets(rows, [t for t in target_labels(specs) if t in models], softmax_label)}


def long_targets(rows, labels, reference):
    """Per label and target length (:data:`LONG_TARGETS`): the measured speed-up (reference time ÷
    the label's time) and whether it meets the target (None: not measured at that length)."""
    out = {}
    for label in labels:
        per = {}
        for n, need in LONG_TARGETS.items():
            row = next((r for r in rows if r["seq_len"] == n), None)
            results = row["results"] if row else {}
            if label in results and reference in results:
                speedup = results[reference]["median_ms"] / results[label]["median_ms"]
                per[str(n)] = {"min_speedup": need, "speedup": speedup, "met": speedup >= need}
            else:
                per[str(n)] = {"min_speedup": need, "speedup": None, "met": None}
        out[label] = per
    return out


def run_long_bench(out_dir, geometries=DEFAULT_GEOMETRIES, methods=None, seq_lens=DEFAULT_LONG_SEQ_LENS, *,
                   batch_size=1, threads=None, repeats=3, warmup=1, memory=True, softmax_max_bytes=None, seed=0,
                   log=print, device="cpu", dtype="fp32", clock="wall", convert_sliding_window=False):
    """Whole models against softmax SDPA at long lengths; write ``bench-long.json`` and ``bench-long.md``.

    ``geometries``: names for :func:`geometry_model` or ``{name: model}``. ``methods``: as
    :func:`linearize.bench.run_bench` takes them (default :func:`default_long_methods`).
    ``softmax_max_bytes``: the memory cap of :func:`softmax_skip_reason` (default: half the
    machine's memory; on CUDA half the GPU's). ``device`` / ``dtype`` / ``clock``:
    as :func:`linearize.bench.run_bench`. ``convert_sliding_window``: convert sliding-window layers
    too (ModernBERT's local layers, to windowed linear attention; by default they stay softmax).
    Returns the dict written to ``bench-long.json``: ``machine``, ``config``,
    ``targets`` and ``models`` (per geometry: ``info``, ``refused`` {label: convert's reason},
    ``rows`` (per length ``results[label]`` with ``median_ms``, ``time_vs_softmax``,
    ``peak_extra_bytes``, and ``skipped``), ``crossover`` and ``targets``).
    """
    seq_lens = sorted({int(n) for n in seq_lens})
    if not seq_lens or seq_lens[0] < 1 or repeats < 1 or warmup < 0:
        raise LinearizeError(f"lengths must be positive, repeats ≥ 1 and warmup ≥ 0; got {seq_lens}, {repeats}, "
                             f"{warmup}")
    specs = _method_specs(default_long_methods() if methods is None else methods)
    placement = Placement.parse(device, dtype, clock)
    softmax_max_bytes = default_softmax_max_bytes(placement) if softmax_max_bytes is None else int(softmax_max_bytes)
    named = geometries.items() if isinstance(geometries, dict) else [(g, None) for g in geometries]
    out_dir = Path(out_dir)
    result = {"machine": None, "complete": False,
              "config": {"seq_lens": seq_lens, "batch_size": batch_size, **placement.record(), "repeats": repeats,
                         "warmup": warmup, "memory": memory, "softmax_max_bytes": softmax_max_bytes, "seed": seed,
                         "convert_sliding_window": bool(convert_sliding_window),
                         "methods": {label: {"method": name, "options": options} for label, name, options in specs},
                         "crossover_rule": CROSSOVER_RULE},
              "targets": {"labels": target_labels(specs), "min_speedup": {str(n): s for n, s in LONG_TARGETS.items()}},
              "models": [], "files": {"json": str(out_dir / LONG_FILES[0]), "markdown": str(out_dir / LONG_FILES[1])}}
    started = time.time()
    with measuring(threads) as machine:
        result["machine"] = machine
        for name, model in named:
            model = geometry_model(name, seed) if model is None else model
            result["models"].append(bench_geometry(name, model, specs, seq_lens, batch_size=batch_size,
                                                   repeats=repeats, warmup=warmup, memory=memory,
                                                   softmax_max_bytes=softmax_max_bytes, seed=seed, log=log,
                                                   placement=placement,
                                                   convert_sliding_window=convert_sliding_window))
            result["elapsed_s"] = round(time.time() - started, 1)
            write_long(result)  # after every geometry: a crash keeps the finished ones
    result["complete"] = True
    write_long(result)
    if log:
        for entry in result["models"]:
            for label, cross in entry["crossover"].items():
                log(f"{entry['geometry']}: crossover {label}: {crossover_text(cross)}")
        log(f"wrote {result['files']['json']}, {result['files']['markdown']}")
    return result


def write_long(result):
    """Write ``bench-long.md`` and ``bench-long.json`` (atomically) from ``result``."""
    atomic_write_text(result["files"]["markdown"], long_markdown(result))
    atomic_write_json(result["files"]["json"], result)


# ---- 2. a converted folder's crossover --------------------------------------------------------------

def is_converted_folder(path):
    """True when ``path`` is a folder holding a linearize-converted model (config.json with its block)."""
    from .convert import read_linearize_block

    if path is None or not (Path(path) / "config.json").is_file():
        return False
    try:
        read_linearize_block(path)
    except LinearizeError:
        return False
    return True


def bench_folder(directory, seq_lens=DEFAULT_FOLDER_SEQ_LENS, *, batch_size=1, threads=None, repeats=5, warmup=2,
                 memory=True, softmax_max_bytes=None, seed=0, log=print, device="cpu", dtype="fp32", clock="wall"):
    """A converted model folder against its softmax original (same weights, ``linearize.revert``);
    the result is written atomically to ``directory/bench.json`` and returned.

    Lengths past the model's positions are skipped with the reason (``skipped_lengths``). The
    record holds the rows (as :func:`measure_lengths`), the ``crossover``
    (:func:`linearize.bench.crossover_point`), the ``machine`` it was measured on and when.
    """
    from .convert import load, revert, summary

    directory = Path(directory)
    about = summary(directory)  # a one-line error for a folder that is not a converted model
    if about["base_model_type"] == "timm" or "image_size" in json.loads((directory / "config.json").read_text()):
        raise LinearizeError(f"{directory} is a vision model; `linearize bench --model DIR` measures text models "
                             "(token inputs)")
    model = load(directory).eval()
    softmax = revert(copy.deepcopy(model)).eval()
    softmax_label = f"softmax ({getattr(softmax.config, '_attn_implementation', None) or 'default'})"
    limit = accepted_length(model)
    wanted = sorted({int(n) for n in seq_lens})
    if not wanted or wanted[0] < 1 or repeats < 1 or warmup < 0:
        raise LinearizeError(f"lengths must be positive, repeats ≥ 1 and warmup ≥ 0; got {wanted}, {repeats}, {warmup}")
    measured = [n for n in wanted if limit is None or n <= int(limit)]
    skipped = {str(n): f"longer than the model's {limit} positions (convert with --max-length N to go further)"
               for n in wanted if n not in measured}
    if not measured:
        raise LinearizeError(f"every length {wanted} is longer than the model's {limit} positions; pass "
                             f"--model-seq-lens with lengths ≤ {limit}")
    if skipped and log:
        log(f"skipped N = {', '.join(skipped)}: longer than the model's {limit} positions")
    placement = Placement.parse(device, dtype, clock)
    softmax_max_bytes = default_softmax_max_bytes(placement) if softmax_max_bytes is None else int(softmax_max_bytes)
    method = about["method"]
    with measuring(threads) as machine:
        rows = measure_lengths({softmax_label: softmax, method: model}, softmax_label, measured,
                               batch_size=batch_size, repeats=repeats, warmup=warmup, memory=memory,
                               softmax_max_bytes=softmax_max_bytes, seed=seed, log=log, placement=placement)
    record = {"kind": "linearize bench --model", "version": 1, "method": method, "options": about["options"],
              "reference": softmax_label, "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                  timespec="seconds"), "machine": machine,
              "config": {"seq_lens": wanted, "batch_size": batch_size, **placement.record(), "repeats": repeats,
                         "warmup": warmup, "memory": memory, "seed": seed, "crossover_rule": CROSSOVER_RULE},
              "rows": rows, "skipped_lengths": skipped,
              "crossover": crossovers(rows, [method], softmax_label).get(method)}
    atomic_write_json(directory / FOLDER_BENCH_JSON, record)
    if log:
        log(f"{method}: {crossover_text(record['crossover'])}; written to {directory / FOLDER_BENCH_JSON}")
    return record


def read_folder_bench(directory):
    """The ``bench.json`` :func:`bench_folder` wrote into a model folder, or None."""
    path = Path(directory) / FOLDER_BENCH_JSON
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") == "linearize bench --model" else None


def machine_text(machine):
    """``"AMD EPYC … (2 usable cores, 2 torch threads, torch 2.x)"``."""
    return (f"{machine.get('cpu_model')} ({machine.get('usable_cores')} usable cores, "
            f"{machine.get('torch_threads')} torch threads, torch {machine.get('torch')})")


def folder_speed_lines(record):
    """``{"crossover", "time ÷ softmax", "measured on"}``: what ``linearize info`` and the card state."""
    method, reference = record["method"], record["reference"]
    ratios = ", ".join(f"{row['results'][method]['time_vs_softmax']:.2f} at N = {row['seq_len']:,}"
                       for row in record["rows"] if "time_vs_softmax" in row["results"].get(method, {}))
    skipped = [int(n) for n in record.get("skipped_lengths") or {}]
    if skipped:
        ratios += f"; not measured at N = {', '.join(f'{n:,}' for n in skipped)} (past the model's positions)"
    date = str(record.get("measured_at", ""))[:10]
    return {"crossover": crossover_text(record.get("crossover"), unit=reference),
            "time ÷ softmax": ratios or "—",
            "measured on": f"{machine_text(record.get('machine') or {})}, batch {record['config']['batch_size']}, "
                           f"{date}"}


# ---- text ------------------------------------------------------------------------------------------

def _mib(nbytes):
    return "—" if nbytes is None else f"{nbytes / 2**20:.1f}"


def _cell(row, label, softmax):
    """``"ms (speed-up×) / MiB"`` of one label at one length, or why it is missing."""
    measured = row["results"].get(label)
    if measured is None:
        return "skipped" if label in row["skipped"] else "—"
    ratio = measured.get("time_vs_softmax")
    speed = f" ({1 / ratio:.2f}×)" if ratio and label != softmax else ""
    return f"{measured['median_ms']:.1f}{speed} / {_mib(measured.get('peak_extra_bytes'))}"


def _target_line(label, n, target):
    need = target["min_speedup"]
    if target["met"] is None:
        return f"- {label} at N = {int(n):,}: ≥ {need}× — not measured"
    verdict = "pass" if target["met"] else f"miss by {need - target['speedup']:.2f}×"
    return f"- {label} at N = {int(n):,}: {target['speedup']:.2f}× (target ≥ {need}×) — **{verdict}**"


def _geometry_markdown(entry):
    info, rows = entry["info"], entry["rows"]
    softmax = info["softmax_label"]
    labels = [softmax] + entry["methods"]
    lines = [f"## {entry['geometry']}: {info['architecture']}, {info['num_layers']} layers, hidden "
             f"{info['hidden_size']}, {info['num_heads']} heads", "", info["geometry"] + ".", ""]
    if info["positions"].get("extended_to"):
        lines += [f"Positions extended from {info['positions']['learned']} to {info['positions']['extended_to']:,} "
                  "by `linearize.convert(..., max_length=N)` (tiling); softmax gets the same table.", ""]
    if info["positions"].get("note"):
        lines += [info["positions"]["note"] + ".", ""]
    for label in info["keeps_softmax_layers"]:
        lines += [f"{label} converts attention layers {info['converted_layers'][label]} of {info['num_layers']}; the "
                  "others stay softmax (and share softmax's memory cap).", ""]
    if entry["refused"]:
        lines += [f"- {label}: not measured — convert refused: {reason}" for label, reason in entry["refused"].items()]
        lines.append("")
    lines += ["Median forward ms; in brackets softmax time ÷ the method's "
              "(above 1: faster). Peak extra MiB of one forward after the slash.", "",
              "| N | " + " | ".join(labels) + " |", "|---:|" + "---:|" * len(labels)]
    lines += [f"| {row['seq_len']:,} | " + " | ".join(_cell(row, label, softmax) for label in labels) + " |"
              for row in rows]
    skipped = [f"- N = {row['seq_len']:,}: {label} skipped: {reason}"
               for row in rows for label, reason in row["skipped"].items()]
    lines += [""] + skipped if skipped else []
    if entry["crossover"]:
        lines += ["", "Crossover against softmax:", ""]
        lines += [f"- {label}: {crossover_text(cross)}" for label, cross in entry["crossover"].items()]
    if entry["targets"]:
        lines += ["", "Targets (issue 19: whole model ≥ 1.5× faster at 2,048, ≥ 2.5× at 4,096, ≥ 4× at 8,192):", ""]
        lines += [_target_line(label, n, target) for label, per in entry["targets"].items() for n, target in per.items()]
    return lines + [""]


def long_markdown(result):
    """The tables of ``bench-long.md``."""
    machine, cfg = result["machine"], result["config"]
    lines = ["# linearize benchmark: whole models at long lengths", "",
             f"Machine: {machine['cpu_model']}, {machine['usable_cores']} usable cores, {machine['memory_gib']} GiB, "
             f"torch {machine['torch']}, {machine['torch_threads']} threads; other processes used "
             f"{machine.get('other_processes_cores')} cores on average during the run.",
             *([f"**Warning: {machine['busy_warning']}.**"] if machine.get("busy_warning") else []),
             *([] if result.get("complete") else ["**Partial: the run has not finished every model yet.**"]),
             f"Batch {cfg['batch_size']}, {cfg.get('placement', 'cpu, float32')}, no padding; {cfg['warmup']} warm-up + {cfg['repeats']} timed rounds, "
             "candidates interleaved; medians. Crossover: " + cfg["crossover_rule"] + ".",
             *(["Sliding-window layers converted too (windowed linear attention, `--convert-sliding-window`)."]
               if cfg.get("convert_sliding_window") else []), ""]
    for entry in result["models"]:
        lines += _geometry_markdown(entry)
    return "\n".join(lines)
