"""``linearize.convert`` / ``revert`` / ``load``: the one conversion entry point.

``convert(model, method, layers=None, **options)`` works in place on every model a backend handles
(``backends/``: Hugging Face encoders, see ``hf_attention.ATTENTION_CLASSES``, and timm
``VisionTransformer`` models). A converted model gains a ``save_pretrained`` that writes the weights
and the ``linearize`` config block (HF models also their self-contained remote code), and
``linearize.load`` restores it.
"""

from __future__ import annotations

import dataclasses
import numbers
from pathlib import Path

from huggingface_hub.errors import StrictDataclassError

from ..attention.feature_maps import check_conversion_options
from ..config import HybridConfig, SlidingWindowConfig
from ..errors import LinearizeError
from . import positions, resolution, sentence_transformers
from .backends import backend_for, backend_for_record, hf_attention
from .backends.hf import base_config, linearized_hf_class, load_processor  # noqa: F401  (public names)
from .loading import check_loading_info, read_conversion_record  # noqa: F401  (public names)
from .memory import check_feature_map_memory, map_bytes, meta_feature_map
from ..outputs import writes_output
from .record import ConversionRecord

SUPPORTED = sorted(hf_attention.ATTENTION_CLASSES) + ["timm VisionTransformer"]


def _version():
    from ..version import __version__

    return __version__


def _check_layers(layers, count):
    """The sorted indices ``layers`` names (None: all ``count`` layers); a one-line ``LinearizeError``
    unless it is a non-empty list of distinct integers in ``0..count-1``: nothing is rounded (0.5 is
    not layer 0) and an empty list is no conversion at all."""
    if layers is None:
        return list(range(count))
    problem = _layers_problem(layers, count)
    if problem:
        raise LinearizeError(f"layers {layers!r}: {problem}; give a non-empty list of distinct integers in "
                             f"0..{count - 1} (the model has {count} attention layers), or none for all")
    return sorted(int(index) for index in layers)


def _layers_problem(layers, count):
    """What is wrong with the layer list ``layers`` of a model with ``count`` attention layers, or None."""
    if not isinstance(layers, (list, tuple, set, frozenset, range)):
        return "not a list"
    if not layers:
        return "names no layer"
    seen = set()
    for index in layers:
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            return f"{index!r} is not an integer"
        if not 0 <= index < count:
            return f"{index} is out of range"
        if index in seen:
            return f"{index} is named twice"
        seen.add(index)
    return None


def _choose_layers(layers, count, sliding, convert_sliding_window):
    """The layers to convert: ``layers`` (default all) without the sliding-window ones unless
    ``convert_sliding_window``; naming a sliding-window layer without it is an error, so a local layer is
    never converted by accident (it would stay local, but no longer softmax)."""
    chosen = _check_layers(layers, count)
    if convert_sliding_window:
        return chosen
    if layers is None:
        return [index for index in chosen if index not in sliding]
    local = sorted(set(chosen) & set(sliding))
    if local:
        raise LinearizeError(f"layers {local} attend through a sliding window: pass convert_sliding_window=True "
                             "(--convert-sliding-window) to make them windowed linear attention, or leave them out")
    return chosen


def _sliding_window_choice(convert_sliding_window, sliding):
    """``convert_sliding_window`` checked: a bool (None: the default), and True only for a model that has
    sliding-window layers (else it would do nothing)."""
    if convert_sliding_window is None:
        return SlidingWindowConfig().convert_sliding_window
    if not isinstance(convert_sliding_window, bool):
        raise LinearizeError(f"convert_sliding_window must be True or False, got {convert_sliding_window!r}")
    if convert_sliding_window and not sliding:
        raise LinearizeError("--convert-sliding-window converts sliding-window layers (ModernBERT's local layers), "
                             "and this model has none: drop it")
    return convert_sliding_window


def _check_window_below_length(model, hybrid, max_length):
    """A window whose exact part covers every input the model reads (its ``max_position_embeddings``, or
    ``max_length`` when extended; ``hybrid_attention`` is exact softmax up to 2R tokens) would leave no linear
    attention: an error, not a silent softmax model."""
    longest = max_length or getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if hybrid and hybrid["window"] and isinstance(longest, int) and longest <= 2 * hybrid["window"]:
        raise LinearizeError(f"--window {hybrid['window']} makes every input of up to {longest} tokens (all this "
                             f"model reads) exact softmax, with no linear attention left: choose a window below "
                             f"{longest // 2}, or extend the positions with --max-length")


def _unsupported(model):
    kind = getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__
    return LinearizeError(f"unsupported architecture {kind!r}; supported: {', '.join(SUPPORTED)}")


def attention_modules(model):
    """The model's self-attention modules, in order, or a LinearizeError naming what is supported."""
    backend = backend_for(model)
    modules = backend.attention_modules(model) if backend else []
    if not modules:
        raise _unsupported(model)
    return modules


def is_converted(model):
    return hasattr(type(model), "_linearize_base") or any(hasattr(m, "linearize_map") for m in model.modules())


def check_convertible(model, method, *, layers=None, window=None, sinks=None, gamma=None, hybrid_layers=None,
                      **options):
    """A one-line ``LinearizeError`` unless ``model`` can be converted to ``method`` with these
    ``layers``, hybrid settings and ``options``: checked before a long stage (a teacher's fine-tuning) runs."""
    check_conversion_options(method, options)
    hybrid = hybrid_settings(window, sinks, gamma, method, hybrid_layers)
    if is_converted(model):
        raise LinearizeError("this model is already converted; start from its softmax source")
    modules = attention_modules(model)
    chosen = _check_layers(layers, len(modules))
    _check_hybrid_layers(hybrid, chosen, backend_for(model).sliding_window_layers(model))
    check_memory(model, method, chosen, options)


def feature_map_bytes(model, method, layers, options):
    """Bytes of the parameters and buffers that ``method``'s feature maps on ``layers`` add to
    ``model`` (in its dtype), counted on PyTorch's meta device (:func:`memory.meta_feature_map`):
    nothing is allocated, and a map that cannot be built for this geometry raises its one-line
    error here."""
    import torch

    modules = attention_modules(model)
    reference = next(model.parameters(), None)
    element = torch.empty((), dtype=reference.dtype if reference is not None else torch.float32).element_size()
    sizes = {}
    for index in layers:
        geometry = _head_geometry(model, modules[index][1])
        if geometry not in sizes:
            sizes[geometry] = map_bytes(meta_feature_map(method, *geometry, options), element)
    return sum(sizes[_head_geometry(model, modules[index][1])] for index in layers)


def _head_geometry(model, module):
    """``(head_dim, num_heads)`` of one attention module (a timm block's own, else the HF config's)."""
    if backend_for(model).name == "timm":
        return module.head_dim, module.num_heads
    return hf_attention.head_geometry(model.config)


def check_memory(model, method, layers, options):
    """A one-line ``LinearizeError`` when the feature maps of ``layers`` would take more than
    :data:`~linearize.convert.memory.FEATURE_MAP_MEMORY_SHARE` of this machine's memory (a huge
    option value), naming the options to lower; checked before any map is allocated."""
    if layers:
        check_feature_map_memory(method, feature_map_bytes(model, method, layers, options), len(layers), options)


def convert(model, method="luna", *, layers=None, source=None, max_length=None, position_init=None, image_size=None,
            convert_sliding_window=None, window=None, sinks=None, gamma=None, hybrid_layers=None, **options):
    """Replace softmax self-attention by ``method`` in place and return the model.

    ``layers``: indices of the attention layers to convert (default all but sliding-window layers),
    a non-empty list of distinct integers; the others stay softmax. ``convert_sliding_window`` (``config.SlidingWindowConfig``): also convert
    sliding-window layers (ModernBERT's local layers), to windowed linear attention (a local layer
    never becomes global). ``options``: the method's options (``linearize.method_options(method)``).
    ``max_length`` / ``position_init`` (``config.PositionsConfig``): extend a learned position
    table to ``max_length`` tokens, tiled (default) or interpolated (``convert.positions``).
    ``image_size`` (``config.PositionsConfig``): make a vision model take S×S images, its position
    grid interpolated as in the ViT paper, §3.2 (``convert.resolution``).
    ``window`` / ``sinks`` / ``gamma`` (``config.HybridConfig``; None: its defaults): hybrid attention,
    exact softmax over the keys of each query's block of ``window`` tokens and the two neighbouring blocks
    and over the ``sinks`` (``"first,last"``), linear attention over the rest, mixed by a learned γ per head starting at ``gamma``
    (``linearize.attention.hybrid``); the converted global layers become hybrid (``hybrid_layers``: only these of
    them, the others pure linear attention), sliding-window layers never.
    Pretrained weights are untouched; each converted attention module gains a
    ``linearize_map`` submodule holding the method's parameters and buffers (their size is checked
    against the machine's memory first: :func:`check_memory`).
    """
    check_conversion_options(method, options)
    modules = attention_modules(model)
    backend = backend_for(model)
    if is_converted(model):
        raise LinearizeError("this model is already converted; call linearize.revert(model) first to convert again")
    sliding = backend.sliding_window_layers(model)
    convert_sliding_window = _sliding_window_choice(convert_sliding_window, sliding)
    chosen = _choose_layers(layers, len(modules), sliding, convert_sliding_window)
    hybrid = hybrid_settings(window, sinks, gamma, method, hybrid_layers)
    if hybrid and hybrid["hybrid_layers"] is None and set(chosen) & set(sliding):
        raise LinearizeError(f"--window/--sinks make global layers hybrid; layers {sorted(set(chosen) & set(sliding))} "
                             "attend through a sliding window already: convert without --convert-sliding-window, or "
                             "without --window/--sinks (or name the global ones with --hybrid-layers)")
    _check_hybrid_layers(hybrid, chosen, sliding)
    max_length, position_init = positions.check_max_length(model, max_length, position_init)
    _check_window_below_length(model, hybrid, max_length)
    image_size = resolution.check_image_size(model, image_size)
    check_memory(model, method, chosen, options)
    before = sum(p.numel() for p in model.parameters())
    found = backend.record(model, source)  # before attach: the model's own class and attention
    backend.attach(model, method, chosen, options, hybrid)
    added = int(sum(p.numel() for p in model.parameters()) - before)
    if max_length is not None:  # after attach: the model owns its config now
        positions.extend_positions(model, max_length, position_init)
        # sentence-transformers' max_seq_length follows
        found["sentence_transformers_files"] = sentence_transformers.with_max_length(
            found.get("sentence_transformers_files"), max_length)
    if image_size is not None:
        resolution.resize_image_positions(model, image_size)
    backend.store_record(model, ConversionRecord(
        method=method, options=dict(options), layers=tuple(chosen), num_attention_layers=len(modules),
        sliding_window_layers=tuple(sliding), parameters_added=added, **(hybrid or {}),
        parameters_base=int(sum(p.numel() for p in model.parameters()) - added), max_length=max_length,
        position_init=position_init if max_length is not None else None, image_size=image_size,
        linearize_version=_version(), **found))
    return model


def hybrid_settings(window=None, sinks=None, gamma=None, method=None, hybrid_layers=None):
    """``{window, sinks, gamma, hybrid_layers}`` for the converted layers (``FeatureMap.make_hybrid`` takes the
    first three in ``hybrid_layers``, a sorted tuple, or in every converted layer for None; None values:
    ``HybridConfig``'s defaults), checked; None for pure linear attention (window 0, no sinks). An unknown sink,
    a negative window, a γ that is not positive, γ or hybrid layers given without a window or sinks (nothing to
    weigh, nothing to make hybrid), and a window or sinks for exact softmax (``method``) are one-line errors.
    ``hybrid_layers`` may be a list or a string of indices separated by ``,`` or ``+`` (a bench spec's)."""
    from ..attention.hybrid import parse_sinks

    defaults = HybridConfig()
    config = HybridConfig(window=defaults.window if window is None else window,
                          sinks=defaults.sinks if sinks is None else sinks, gamma=gamma,
                          hybrid_layers=_layer_list(hybrid_layers))
    config.check()
    try:
        names = parse_sinks(config.sinks)
    except ValueError as error:
        raise LinearizeError(str(error)) from None
    if not config.window and not names:
        if config.gamma is not None:  # no exact part to weigh the linear part against
            raise LinearizeError(f"--gamma {config.gamma} weighs the linear part of a hybrid against its exact part, "
                                 "and without --window or --sinks there is none: add --window R and/or --sinks "
                                 "first, or drop --gamma")
        if config.hybrid_layers is not None:  # no window or sinks to give the layers
            raise LinearizeError(f"--hybrid-layers {config.hybrid_layers} names the layers that get the window and "
                                 "the sinks, and without --window or --sinks there are none: add --window R and/or "
                                 "--sinks first, or drop --hybrid-layers")
        return None
    from ..attention.feature_maps import FeatureMap, get_feature_map_class

    map_class = FeatureMap if method is None else get_feature_map_class(method)
    if map_class.exact_softmax:
        raise LinearizeError(f"--window/--sinks make part of a linear method's attention exact; {method} is exact "
                             "already: drop them, or choose a linear method")
    start = map_class.initial_gamma if config.gamma is None else config.gamma  # the method's measured start
    chosen = None if config.hybrid_layers is None else tuple(sorted(config.hybrid_layers))
    return {"window": int(config.window), "sinks": names, "gamma": float(start), "hybrid_layers": chosen}


def _layer_list(value):
    """``hybrid_layers`` as a list of ints (a bench spec gives ``"0+1+2"``), or None; a value that is not
    integers is a one-line error."""
    if value is None or isinstance(value, (list, tuple)):
        return None if value is None else list(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    try:
        return [int(part) for part in str(value).replace("+", ",").split(",") if part.strip()]
    except ValueError:
        raise LinearizeError(f"--hybrid-layers {value!r}: give layer indices, e.g. 0,1,2") from None


def _check_hybrid_layers(hybrid, chosen, sliding):
    """Every hybrid layer is a converted global layer: a layer left softmax, or a sliding-window one (never
    hybrid), named in ``hybrid_layers`` could not take the window (a one-line error)."""
    if not hybrid or hybrid["hybrid_layers"] is None:
        return
    wrong = sorted(set(hybrid["hybrid_layers"]) - set(chosen))
    if wrong:
        raise LinearizeError(f"--hybrid-layers {wrong}: not converted (converted: {list(chosen)}); name converted "
                             "layers, or convert them with --layers")
    local = sorted(set(hybrid["hybrid_layers"]) & set(sliding))
    if local:
        raise LinearizeError(f"--hybrid-layers {local} attend through a sliding window and never become hybrid: "
                             "name global layers only")


def revert(model):
    """Restore softmax attention (pretrained weights unchanged) and return the model."""
    backend = backend_for(model)
    if backend is None:
        raise _unsupported(model)
    backend.detach(model)
    return model


def revert_layers(model, layers):
    """Restore softmax attention in the converted attention layers ``layers`` only, keeping every other
    converted layer as it is (its trained feature map, γ included), and return the model: its record then
    lists the layers still converted. At least one converted layer must stay (else :func:`revert`)."""
    record = conversion_record(model)
    if record is None:
        raise LinearizeError("revert_layers() takes a model converted with linearize.convert")
    layers = {int(layer) for layer in layers}
    keep = [layer for layer in record.layers if layer not in layers]
    if layers - set(record.layers) or not keep:
        raise LinearizeError(f"revert_layers: layers {sorted(layers)} must be some, not all, of the converted layers "
                             f"{list(record.layers)}")
    trained = {layer: fm.state_dict() for layer, fm in feature_maps_of(model).items() if layer in keep}
    revert(model)
    hybrid = record.hybrid or {}
    hybrid_layers = hybrid.get("hybrid_layers")
    if hybrid_layers is not None:  # the hybrid layers still converted; none left: the rest is pure linear
        hybrid_layers = [layer for layer in hybrid_layers if layer in keep]
        hybrid = hybrid if hybrid_layers else {}
    convert(model, record.method, layers=keep, source=record.source, window=hybrid.get("window"),
            sinks=",".join(hybrid["sinks"]) if hybrid.get("sinks") else None, gamma=hybrid.get("gamma"),
            hybrid_layers=hybrid_layers or None,
            convert_sliding_window=bool(set(keep) & set(record.sliding_window_layers)), **record.options)
    for layer, fm in feature_maps_of(model).items():
        fm.load_state_dict(trained[layer])
    # what the first conversion did beyond the attention (positions extended, images resized, the source's
    # sentence-transformers files) stays done: its record says so, not a second conversion's
    kept = {name: getattr(record, name) for name in ("max_length", "position_init", "image_size",
                                                     "sentence_transformers_files")}
    backend_for(model).store_record(model, dataclasses.replace(conversion_record(model), **kept))
    return model


def conversion_record(model):
    """The :class:`~linearize.convert.record.ConversionRecord` of a converted model (method, options,
    layers, source, parameter counts), or None for a model that is not converted."""
    stored = getattr(getattr(model, "config", None), "linearize", None) or getattr(model, "linearize_config", None)
    return None if stored is None else ConversionRecord.from_block(stored)


def feature_maps_of(model):
    """``{attention layer index: feature map}`` of a converted model."""
    return {i: m.linearize_map for i, (_, m) in enumerate(attention_modules(model)) if hasattr(m, "linearize_map")}


def save(model, directory, overwrite=False):
    """Save a converted model (any backend) so that ``linearize.load`` restores it exactly. The folder is
    written whole or not at all (``outputs.atomic_dir``); an existing non-empty one is replaced only with
    ``overwrite`` (it is refused otherwise: two models' files mixed in one folder would load as neither)."""
    from ..outputs import atomic_dir, prepare_output_dir

    backend = backend_for(model)
    if backend is None or conversion_record(model) is None:
        raise LinearizeError("save() takes a model converted with linearize.convert")
    path = prepare_output_dir(directory, overwrite=overwrite, how="overwrite=True")
    with atomic_dir(path) as tmp:
        backend.save(model, tmp)


def load(directory, **kwargs):
    """Load a converted model saved by ``save_pretrained``, with its own head, without remote code.

    A saved weight the model does not use, or a weight the folder lacks, is an error (never a
    silent re-initialisation); ``output_loading_info=True`` also returns transformers' load report."""
    from .loading import error_summary

    directory = Path(directory)
    data, record = read_conversion_record(directory)
    try:
        return backend_for_record(record).load(directory, data, record, **kwargs)
    except StrictDataclassError as error:  # a config.json field of the wrong type
        raise LinearizeError(f"could not load {directory}: {error_summary(error)}; fix its config.json") from None


def parameter_overhead(model):
    """``(added, base)`` parameter counts of a converted model."""
    record = conversion_record(model)
    added = sum(p.numel() for fm in feature_maps_of(model).values() for p in fm.parameters())
    total = sum(p.numel() for p in model.parameters())
    return added, record.parameters_base if record and record.parameters_base is not None else total - added
# ---- checkpoints on disk (what the CLI calls) -----------------------------------------------------

def save_processors(source, directory, model_max_length=None, image_size=None):
    """Copy the source checkpoint's tokenizer or image processor into ``directory`` (if any);
    ``model_max_length`` sets the tokenizer's limit (a model whose positions were extended),
    ``image_size`` the image processor's resize and crop (``resolution.processor_at_size``)."""
    import transformers

    saved = []
    for auto in (transformers.AutoTokenizer, transformers.AutoImageProcessor):
        try:
            processor = auto.from_pretrained(source)
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if model_max_length is not None and hasattr(processor, "model_max_length"):
            processor.model_max_length = int(model_max_length)
        if image_size is not None and auto is transformers.AutoImageProcessor:
            processor = resolution.processor_at_size(processor, image_size)
        processor.save_pretrained(directory)
        saved.append(type(processor).__name__)
    return saved


@writes_output("out")
def convert_checkpoint(model_name, method="luna", out=None, *, layers=None, options=None, overwrite=False,
                       allow_pickle=False, head=None, num_labels=None, max_length=None, position_init=None,
                       image_size=None, convert_sliding_window=None, window=None, sinks=None, gamma=None,
                       hybrid_layers=None):
    """Load ``model_name`` (folder, Hub id or alias), convert it and save it to ``out``.

    ``head`` (``linearize.convert.loading.HEADS``) picks the task head to load instead of the
    checkpoint's own architecture (a new head is randomly initialised, ``num_labels`` outputs).
    ``max_length`` / ``position_init``: extend the position table (``convert``); the saved
    tokenizer's ``model_max_length`` follows. ``image_size``: convert for S×S images; the saved
    image processor follows. ``convert_sliding_window``, ``window``, ``sinks``, ``gamma``, ``hybrid_layers``: as
    ``convert``.
    The folder is written whole or not at all, by one writer at a time (``outputs.writes_output``).
    Returns a summary dict (what ``linearize info`` prints).
    """
    from ..outputs import atomic_dir, prepare_output_dir
    from .loading import load_source_model, resolve_model_name

    options = dict(options or {})
    check_conversion_options(method, options)
    hybrid_settings(window, sinks, gamma, method, hybrid_layers)  # before the model loads
    if out is None:
        raise LinearizeError("pass --out DIR: the folder to write the converted model to")
    if num_labels is not None and num_labels < 1:
        raise LinearizeError(f"--num-labels {num_labels}: a head needs at least 1 output (2 or more classes; "
                             "1 for regression)")
    out = prepare_output_dir(out, overwrite=overwrite, inputs=[resolve_model_name(model_name)])
    extra = {} if num_labels is None else {"num_labels": int(num_labels)}
    model = load_source_model(model_name, allow_pickle=allow_pickle, head=head, **extra)
    if num_labels is not None and not _has_labels_head(model):
        raise LinearizeError(f"--num-labels sizes a classification head, but {model_name} loads as "
                             f"{type(model).__name__}, which has none; add --head sequence-classification "
                             "(or image-classification, token-classification)")
    convert(model, method, layers=layers, source=model_name, max_length=max_length, position_init=position_init,
            image_size=image_size, convert_sliding_window=convert_sliding_window, window=window, sinks=sinks,
            gamma=gamma, hybrid_layers=hybrid_layers, **options)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        save_processors(resolve_model_name(model_name), tmp, model_max_length=max_length, image_size=image_size)
    return summary(out)


def _has_labels_head(model):
    """The model's head has ``num_labels`` outputs (a classification head)."""
    from .heads import head_for_class

    head = head_for_class(type(model).__name__)
    return head is not None and head.pipeline_tag in ("text-classification", "token-classification",
                                                      "image-classification")


def summary(directory):
    """What a saved converted model is: method, layers, source, parameter overhead."""
    data, record = read_conversion_record(directory)
    return {
        "directory": str(directory),
        "architecture": record.architecture,
        "base_model_type": record.base_model_type,
        "model_type": data.get("model_type"),
        "method": record.method,
        "options": dict(record.options),
        "layers": list(record.layers),
        "num_attention_layers": record.num_attention_layers,
        "source": record.source,
        "parameters_added": record.parameters_added,
        "parameters_base": record.parameters_base or 0,
        "parameters_added_percent": record.parameters_added_percent,
        "linearize_version": record.linearize_version,
        "max_length": record.max_length,
        "position_init": record.position_init,
        "image_size": record.image_size,
        "sliding_window_layers": list(record.sliding_window_layers),
        "window": record.window,
        "sinks": list(record.sinks),
        "hybrid_layers": None if record.hybrid_layers is None else list(record.hybrid_layers),
    }
