"""Whole models against softmax at long lengths (``linearize bench long``).

``run_long_bench(out_dir, ...)``: for each model geometry — by default all-MiniLM-L6-v2 (real
weights, its 512 learned positions extended by ``linearize.convert(..., max_length=N)``'s tiling)
and the ModernBERT-base geometry (``transformers.ModernBertConfig()`` defaults, random weights:
only time and memory mean anything) — the whole model's forward at 512 … 16,384 tokens, softmax
(the model's own SDPA attention, positions extended the same way) against one converted copy per
method, timed and profiled with :mod:`linearize.bench.timing` (candidates interleaved, order
rotated each round, medians; peak extra memory from ``torch.profiler``). A method
``linearize.convert`` refuses on a model is recorded with convert's reason, not measured; softmax
is skipped where its N×N matrices would pass a memory cap. Per method: time ratios, the crossover
length (:func:`linearize.bench.crossover_point`) and, for Hedgehog and the default recipe's LUNA,
the issue's targets (:data:`LONG_TARGETS`) as pass/miss. Written (atomically, after every
geometry) to ``bench-long.json`` and ``bench-long.md``.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

from ..config import MeasureConfig
from ..errors import LinearizeError
from ..outputs import atomic_write_json, atomic_write_text, writes_output
from .crossover import CROSSOVER_RULE, crossover_text, crossovers
from .methods import HYBRID_KEYS, method_specs
from .models import default_softmax_max_bytes, learned_positions, measure_lengths, model_info
from .tables import long_markdown
from .timing import CPU, checked_placement, loop_settings, measuring

DEFAULT_LONG_SEQ_LENS = (512, 2048, 4096, 8192, 16384)
DEFAULT_GEOMETRIES = ("minilm", "modernbert-base")
#: label of the default recipe's LUNA (its options are read from the recipe, not copied here)
RECIPE_LUNA = "luna (recipe)"
#: issue 19's whole-model targets: N -> minimum speed-up (softmax time ÷ method time), for
#: Hedgehog and the default recipe's LUNA
LONG_TARGETS = {2048: 1.5, 4096: 2.5, 8192: 4.0}
LONG_FILES = ("bench-long.json", "bench-long.md")
#: how :func:`run_long_bench` measures when given no ``measure``: 3 repeats after 1 warm-up round (whole
#: models at long lengths take long), otherwise :class:`~linearize.config.MeasureConfig`'s defaults
LONG_MEASURE = MeasureConfig(repeats=3, warmup=1)
GEOMETRY_NOTES = {
    "minilm": "all-MiniLM-L6-v2 (pretrained weights), 512 learned positions extended by linearize.convert's tiling",
    "modernbert-base": "ModernBERT-base geometry (transformers' ModernBertConfig defaults: hidden 768, 22 layers, "
                       "12 heads, intermediate 1152, 8,192 rotary positions, sliding window of 128 on 2 of every "
                       "3 layers), random weights",
}


# ---- what is measured ----------------------------------------------------------------------------

def recipe_luna():
    """``("luna", options)`` of the default recipe (``linearize/recipes/minilm-moviereviews.yaml``)."""
    from ..attention.feature_maps import options_for
    from ..recipes import DEFAULT_RECIPE, load_recipe

    recipe = load_recipe(DEFAULT_RECIPE, check_model=False)  # its settings, not its model: any geometry takes them
    return recipe.method, options_for(recipe.method, recipe.options)


def default_long_methods():
    """``{label: method or (method, options)}``: the recipe's LUNA, LUNA's defaults, Hedgehog, T2R,
    DARKFormer, Performer and Flexformer-n."""
    return {RECIPE_LUNA: recipe_luna(), "luna": "luna", "hedgehog": "hedgehog", "t2r": "t2r",
            "darkformer": "darkformer", "performer": "performer", "flexformer-n": "flexformer-n"}


def target_labels(specs):
    """The labels the targets apply to: Hedgehog with its defaults, hybrid or not (issue 34 holds a
    hybrid default to the same targets), and the recipe's LUNA."""
    luna = recipe_luna()
    return [label for label, name, options in specs
            if (name == "hedgehog" and set(options) <= set(HYBRID_KEYS)) or (name, options) == (luna[0], luna[1])]


def geometry_model(name, seed=0):
    """The softmax model of a geometry: ``modernbert-base`` (random weights), or any name
    ``linearize.convert.load_source_model`` loads (``minilm``, a folder, a Hub id)."""
    import transformers

    if name == "modernbert-base":
        torch.manual_seed(seed)
        model = transformers.ModernBertModel(transformers.ModernBertConfig())
        model.config._name_or_path = "ModernBERT-base geometry (random weights)"
        return model.eval()
    from ..convert import load_source_model

    return load_source_model(name).eval()


# ---- one geometry --------------------------------------------------------------------------------

def converted_copies(base, specs, max_length, seed=0, convert_sliding_window=False):
    """``(models, refused, layers, partial)``: a converted deep copy of ``base`` per method spec
    (positions extended to ``max_length`` by ``convert`` where given; sliding-window layers converted
    to windowed linear attention with ``convert_sliding_window``), convert's reason for each
    method it refuses, the attention layers each conversion converted, and the labels of the
    conversions that left some attention layers softmax (e.g. sliding-window layers)."""
    from ..convert import conversion_record, convert
    from ..convert.backends import backend_for

    models, refused, layers, partial = {}, {}, {}, []
    # asked for the models that have sliding-window layers (a model without them has nothing to convert so)
    convert_sliding_window = bool(convert_sliding_window and backend_for(base).sliding_window_layers(base))
    for label, name, options in specs:
        candidate = copy.deepcopy(base)
        torch.manual_seed(seed)
        try:
            convert(candidate, name, max_length=max_length, convert_sliding_window=convert_sliding_window, **options)
        except LinearizeError as error:
            refused[label] = str(error)
            continue
        models[label] = candidate.eval()
        record = conversion_record(candidate)
        layers[label] = list(record.layers)
        if len(layers[label]) < (record.num_attention_layers or 0):
            partial.append(label)
    return models, refused, layers, partial


def user_state_measure(models, reference, seq_lens, *, capped, measure, seed, softmax_max_bytes, log=None,
                       placement=CPU):
    """Rows of ``{label: model or saved folder}`` measured as a user's process gets them
    (:mod:`linearize.bench.user_state`): each model saved to a temporary folder (a converted one
    with its remote code, softmax as plain transformers; a folder is timed as it is), then timed in
    ``measure.processes`` fresh processes that load the folders with plain transformers; the labels of
    ``capped`` skip the lengths where :func:`softmax_skip_reason` says so (``models[reference]``: a model);
    each process loads the folders onto ``placement``'s device in its dtype (compiled with
    ``measure.compile_mode`` where given)."""
    import tempfile

    from ..convert import is_converted, save
    from .models import softmax_skip_reason
    from .user_state import user_state_rows

    first = models[reference]
    skip = {label: [n for n in seq_lens if softmax_max_bytes is not None and
                    softmax_skip_reason(first, measure.batch_size, n, softmax_max_bytes)] for label in capped}
    with tempfile.TemporaryDirectory(prefix="linearize-bench-") as root:
        folders = {}
        for index, (label, model) in enumerate(models.items()):
            if isinstance(model, (str, Path)):  # a saved folder, timed as it is
                folders[label] = model
            else:
                folders[label] = Path(root) / f"model{index}"
                save(model, folders[label]) if is_converted(model) else model.save_pretrained(folders[label])
        return user_state_rows(folders, reference, seq_lens, processes=measure.processes, threads=measure.threads or 2,
                               repeats=measure.repeats, warmup=measure.warmup, batch_size=measure.batch_size,
                               seed=seed, skip=skip, log=log, device=placement.device,
                               dtype=str(placement.torch_dtype).removeprefix("torch."),
                               compile_mode=measure.compile_mode, memory=measure.memory)


def bench_geometry(name, base, specs, seq_lens, *, measure=LONG_MEASURE, softmax_max_bytes=None, seed=0, log=None,
                   placement=CPU, convert_sliding_window=False):
    """One geometry's entry of ``bench-long.json``: info, refused methods, rows, crossovers, targets,
    measured as ``measure`` says (:class:`~linearize.config.MeasureConfig`; ``placement``: its checked
    placement). ``measure.processes`` > 0: in that many fresh processes of plain transformers
    (:func:`user_state_measure`); 0: in this process, with the models in memory."""
    from ..convert.positions import extend_positions

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
    geometry_log = log and (lambda line: log(f"{name}: {line}"))
    measured = dict(capped=[softmax_label, *partial], softmax_max_bytes=softmax_max_bytes, seed=seed,
                    placement=placement, log=geometry_log)
    if measure.processes:
        rows = user_state_measure({softmax_label: softmax, **models}, softmax_label, seq_lens, measure=measure,
                                  **measured)
    else:
        rows = measure_lengths({softmax_label: softmax, **models}, softmax_label, seq_lens, **loop_settings(measure),
                               **measured)
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
                per[str(n)] = _target(results[reference], results[label], need)
            else:
                per[str(n)] = {"min_speedup": need, "speedup": None, "met": None}
        out[label] = per
    return out


def _target(reference, measured, need):
    """One target: the speed-up (reference time ÷ the model's; measured in several processes: the median of
    the per-process ratios, with the lowest and whether one fell more than 15% below the median) and
    whether it meets ``need``."""
    spread = measured.get("speedup")
    if spread is None:
        speedup = reference["median_ms"] / measured["median_ms"]
        return {"min_speedup": need, "speedup": speedup, "met": speedup >= need}
    steady = spread["lowest"] >= 0.85 * spread["median"]
    return {"min_speedup": need, "speedup": spread["median"], "lowest": spread["lowest"], "steady": steady,
            "met": spread["median"] >= need and steady}


# ---- the run ---------------------------------------------------------------------------------------

def _long_result(out_dir, specs, seq_lens, placement, measure, settings):
    """``bench-long.json``'s skeleton before any geometry is measured (``measure``: the
    :class:`~linearize.config.MeasureConfig`; ``settings``: memory cap, seed, sliding-window conversion)."""
    out_dir = Path(out_dir)
    config = {"seq_lens": seq_lens, "batch_size": measure.batch_size, **placement.record(),
              "repeats": measure.repeats, "warmup": measure.warmup, "memory": measure.memory,
              "softmax_max_bytes": settings["softmax_max_bytes"], "seed": settings["seed"],
              "convert_sliding_window": bool(settings["convert_sliding_window"]),
              "methods": {label: {"method": name, "options": options} for label, name, options in specs},
              "crossover_rule": CROSSOVER_RULE}
    return {"machine": None, "complete": False, "config": config,
            "targets": {"labels": target_labels(specs), "min_speedup": {str(n): s for n, s in LONG_TARGETS.items()}},
            "models": [], "files": {"json": str(out_dir / LONG_FILES[0]), "markdown": str(out_dir / LONG_FILES[1])}}


@writes_output("out_dir")
def run_long_bench(out_dir, geometries=DEFAULT_GEOMETRIES, methods=None, seq_lens=DEFAULT_LONG_SEQ_LENS, *,
                   measure: MeasureConfig | None = None, softmax_max_bytes=None, seed=0, log=print,
                   convert_sliding_window=False):
    """Whole models against softmax SDPA at long lengths; write ``bench-long.json`` and ``bench-long.md``.

    ``geometries``: names for :func:`geometry_model` or ``{name: model}``. ``methods``: as
    :func:`linearize.bench.run_bench` takes them (default :func:`default_long_methods`).
    ``softmax_max_bytes``: the memory cap of :func:`linearize.bench.softmax_skip_reason` (default:
    half the machine's memory; on CUDA half the GPU's). ``convert_sliding_window``: convert
    sliding-window layers too (ModernBERT's local layers, to windowed linear attention; by default
    they stay softmax). ``measure``: how to measure (:class:`linearize.config.MeasureConfig`; None:
    :data:`LONG_MEASURE`, 3 repeats after 1 warm-up round); its ``device`` / ``dtype`` / ``clock`` as
    :func:`linearize.bench.run_bench` takes them. ``measure.processes`` > 0: every model is timed in
    that many fresh processes that load its saved folder with plain transformers onto the device in
    the dtype, the state a user is in (:mod:`linearize.bench.user_state`), each compiled with
    ``torch.compile(mode=measure.compile_mode)`` where given; 0: in this process. Returns the dict
    written to ``bench-long.json``: ``machine``, ``config``, ``targets`` and ``models`` (per
    geometry: ``info``, ``refused`` {label: convert's reason}, ``rows`` (per length
    ``results[label]`` with ``median_ms``, ``time_vs_softmax``, ``peak_extra_bytes``, and
    ``skipped``), ``crossover`` and ``targets``).
    """
    seq_lens = sorted({int(n) for n in seq_lens})
    if not seq_lens or seq_lens[0] < 1:
        raise LinearizeError(f"lengths must be positive; got {seq_lens}")
    measure = LONG_MEASURE if measure is None else measure
    specs = method_specs(default_long_methods() if methods is None else methods)
    placement = user_state_placement(measure)
    softmax_max_bytes = default_softmax_max_bytes(placement) if softmax_max_bytes is None else int(softmax_max_bytes)
    named = geometries.items() if isinstance(geometries, dict) else [(g, None) for g in geometries]
    settings = dict(softmax_max_bytes=softmax_max_bytes, seed=seed, convert_sliding_window=convert_sliding_window)
    result = _long_result(out_dir, specs, seq_lens, placement, measure, settings)
    result["config"]["state"] = user_state_note(measure, placement)
    started = time.time()
    with measuring(measure.threads) as machine:
        result["machine"] = machine
        for name, model in named:
            model = geometry_model(name, seed) if model is None else model
            result["models"].append(bench_geometry(name, model, specs, seq_lens, measure=measure, log=log,
                                                   placement=placement, **settings))
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


def user_state_placement(measure):
    """:func:`~linearize.bench.timing.checked_placement` of ``measure`` for a bench that may time fresh
    processes: ``--processes`` times each fresh process by the wall clock (the parent's CPU clock does not
    count its children's time), and ``compile_mode`` compiles the models in those processes only; one
    line otherwise."""
    placement = checked_placement(measure)
    if measure.compile_mode is not None and not measure.processes:
        raise LinearizeError("compile_mode compiles the models in the fresh processes of --processes: give "
                             "--processes 1 or more with it")
    if measure.processes and placement.clock != "wall":
        raise LinearizeError("--processes times fresh processes by the wall clock; drop --clock cpu, or pass "
                             "--processes 0 to time this process's CPU time")
    return placement


def user_state_note(measure, placement=CPU):
    """What state the models were timed in (``measure``: the bench's MeasureConfig), for the bench's JSON and
    markdown."""
    processes, compile_mode = measure.processes, measure.compile_mode
    if processes:
        where = "" if placement == CPU else f" onto {placement.device} in {placement.dtype}"
        compiled = f", compiled with torch.compile(mode={compile_mode!r})" if compile_mode else ""
        return (f"user's process: each model's saved folder loaded with plain transformers (trust_remote_code, "
                f"linearize not imported){where}{compiled} in {processes} fresh processes, glibc's default allocator, "
                "torch.inference_mode; figures are medians over the processes, with the lowest and highest"
                + ("; peak memory from one untimed forward in the first process" if measure.memory else ""))
    return ("linearize's process: the models in memory in the `linearize bench` process, with the allocator "
            "settings the linearize command applies (linearize.allocator)")


def write_long(result):
    """Write ``bench-long.md`` and ``bench-long.json`` (atomically) from ``result``."""
    atomic_write_text(result["files"]["markdown"], long_markdown(result))
    atomic_write_json(result["files"]["json"], result)
