"""``linearize.convert`` / ``revert`` / ``load``: the one conversion entry point.

``convert(model, method, layers=None, **options)`` works in place on Hugging Face encoders
(see ``hf.ATTENTION_CLASSES``) and timm ``VisionTransformer`` models. Converted HF models keep
their class's behaviour and gain a ``save_pretrained`` that writes the ``linearize`` config
block, ``model.safetensors`` and the self-contained remote code.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..attention.feature_maps import check_method_options, get_feature_map_class
from ..errors import LinearizeError
from ..io import atomic_write_json
from . import hf, remote_code, timm_vit

FORMAT_VERSION = 1
SUPPORTED = sorted(hf.ATTENTION_CLASSES) + ["timm VisionTransformer"]
_HF_SUBCLASSES = {}


def _version():
    from .. import __version__

    return __version__


def _check_layers(layers, count):
    if layers is None:
        return list(range(count))
    layers = sorted({int(i) for i in layers})
    bad = [i for i in layers if not 0 <= i < count]
    if bad:
        raise LinearizeError(f"layers {bad} out of range: the model has {count} attention layers (0..{count - 1})")
    return layers


def _is_hf(model):
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel)


def attention_modules(model):
    """The model's self-attention modules, in order, or a LinearizeError naming what is supported."""
    if _is_hf(model):
        modules = hf.attention_modules(model)
        if getattr(model.config, "is_decoder", False):
            raise LinearizeError("linearize converts bidirectional encoders; this model is configured as a decoder")
    elif timm_vit.is_timm_vit(model):
        modules = timm_vit.timm_attention_modules(model)
    else:
        modules = []
    if not modules:
        kind = getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__
        raise LinearizeError(f"unsupported architecture {kind!r}; supported: {', '.join(SUPPORTED)}")
    return modules


def is_converted(model):
    return hasattr(type(model), "_linearize_base") or any(hasattr(m, "linearize_map") for m in model.modules())


def _own_config(model):
    """Give the model a private copy of its config: conversion writes to it, and a config
    object shared with other models (``from_config(c)`` twice) must not convert them too."""
    import copy

    old = model.config
    new = copy.deepcopy(old)
    for module in model.modules():
        if getattr(module, "config", None) is old:
            module.config = new


def convert(model, method="luna", *, layers=None, source=None, **options):
    """Replace softmax self-attention by ``method`` in place and return the model.

    ``layers``: indices of the attention layers to convert (default all); the others stay
    softmax. ``options``: the method's options (``linearize.method_options(method)``).
    Pretrained weights are untouched; each converted attention module gains a
    ``linearize_map`` submodule holding the method's parameters and buffers.
    """
    check_method_options(method, options)
    modules = attention_modules(model)
    if is_converted(model):
        raise LinearizeError("this model is already converted; call linearize.revert(model) first to convert again")
    chosen = _check_layers(layers, len(modules))
    before = sum(p.numel() for p in model.parameters())
    if _is_hf(model):
        _own_config(model)
        head_dim, num_heads = hf.head_geometry(model.config)
        block = {
            "format_version": FORMAT_VERSION,
            "linearize_version": _version(),
            "method": method,
            "options": dict(options),
            "layers": chosen,
            "num_attention_layers": len(modules),
            "source": source or getattr(model.config, "_name_or_path", None) or None,
            "base_model_type": model.config.model_type,
            "architecture": type(model).__name__,
            "previous_attn_implementation": model.config._attn_implementation,
        }
        hf.register_attention_backend()
        hf.attach_feature_maps(modules, method, set(chosen), options, head_dim, num_heads)
        model.config.linearize = block
        model.set_attn_implementation(hf.ATTENTION_IMPLEMENTATION)
        model.__class__ = linearized_hf_class(type(model))
        _register_output_recording(model)
    else:
        for index, (_, module) in enumerate(modules):
            if index not in chosen:
                continue
            fm = get_feature_map_class(method)(module.head_dim, module.num_heads,
                                               **hf.layer_options(method, options, index))
            reference = next(module.parameters())
            module.linearize_map = fm.to(device=reference.device, dtype=reference.dtype)
            module.__class__ = timm_vit.linearized_class(type(module))
        block = {"format_version": FORMAT_VERSION, "linearize_version": _version(), "method": method,
                 "options": dict(options), "layers": chosen, "num_attention_layers": len(modules),
                 "source": source, "base_model_type": "timm", "architecture": type(model).__name__}
        model.linearize_config = block
    added = sum(p.numel() for p in model.parameters()) - before
    block["parameters_added"] = int(added)
    block["parameters_base"] = int(before)
    return model


def _register_output_recording(model):
    """transformers keys ``output_attentions`` capture on the class name (set in ``__init__``,
    which a class swapped in place never ran): register the new class like the old one."""
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # pragma: no cover - older/newer transformers without the registry
        return
    _CAN_RECORD_REGISTRY[model] = model._can_record_outputs


def revert(model):
    """Restore softmax attention (pretrained weights unchanged) and return the model."""
    if _is_hf(model):
        block = getattr(model.config, "linearize", None)
        for _, module in hf.attention_modules(model):
            if hasattr(module, "linearize_map"):
                del module.linearize_map
        base = getattr(type(model), "_linearize_base", None)
        if base is not None:
            model.__class__ = base
        if block is not None:
            del model.config.linearize
            model.set_attn_implementation(block.get("previous_attn_implementation") or "sdpa")
    elif timm_vit.is_timm_vit(model):
        for _, module in timm_vit.timm_attention_modules(model):
            timm_vit.unpatch(module)
        if hasattr(model, "linearize_config"):
            del model.linearize_config
    else:
        raise LinearizeError(f"unsupported architecture {type(model).__name__!r}; supported: {', '.join(SUPPORTED)}")
    return model


def linearize_config(model):
    """The conversion record (method, options, layers, source, parameter counts) or None."""
    return getattr(getattr(model, "config", None), "linearize", None) or getattr(model, "linearize_config", None)


def feature_maps_of(model):
    """``{attention layer index: feature map}`` of a converted model."""
    return {i: m.linearize_map for i, (_, m) in enumerate(attention_modules(model)) if hasattr(m, "linearize_map")}


# ---- Hugging Face: the converted class, save and load --------------------------------------------

def linearized_hf_class(base):
    """A subclass of a transformers model class that rebuilds its linear attention from
    ``config.linearize`` on construction (so ``from_pretrained`` restores it) and saves the
    remote code with the weights."""
    if base not in _HF_SUBCLASSES:
        def __init__(self, config, *args, **kwargs):
            base.__init__(self, config, *args, **kwargs)
            block = getattr(config, "linearize", None)
            if block is not None:
                hf.apply_linearize_config(self, block)

        _HF_SUBCLASSES[base] = type(remote_code.remote_class_name(base.__name__), (base,), {
            "__init__": __init__, "save_pretrained": _save_pretrained, "_linearize_base": base,
            "__module__": __name__})
    return _HF_SUBCLASSES[base]


def _save_pretrained(self, save_directory, *args, **kwargs):
    """``save_pretrained`` plus the ``linearize`` config block, own model type and remote code."""
    base = type(self)._linearize_base
    base.save_pretrained(self, save_directory, *args, **kwargs)
    block = self.config.linearize
    auto_map = remote_code.write_remote_code(save_directory, block["base_model_type"],
                                             type(self.config).__name__, _version())
    path = Path(save_directory) / "config.json"
    data = json.loads(path.read_text())
    data["model_type"] = remote_code.model_type_for(block["base_model_type"])
    data["architectures"] = [remote_code.remote_class_name(base.__name__)]
    data["auto_map"] = auto_map
    data["linearize"] = block
    atomic_write_json(path, data)


def read_linearize_block(directory):
    """The ``linearize`` block of a saved model's config.json, or a LinearizeError saying why not."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise LinearizeError(f"{directory} has no config.json: it is not a saved model folder")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise LinearizeError(f"{path} is not valid JSON ({error}); re-save or re-download the model") from None
    block = data.get("linearize")
    if not block:
        raise LinearizeError(f"{directory} is not a linearize-converted model (config.json has no 'linearize' "
                             "block); convert it first with `linearize convert`")
    return data, block


def base_config(directory):
    """The source architecture's own config class for a saved converted model (no remote code)."""
    import transformers

    data, block = read_linearize_block(directory)
    config_dict = {k: v for k, v in data.items() if k not in ("model_type", "auto_map", "architectures")}
    config = transformers.AutoConfig.for_model(block["base_model_type"], **config_dict)
    config.linearize = block
    return config


def load_processor(directory):
    """The tokenizer or image processor saved with a converted model, or None.

    The base config is handed over so transformers does not ask to run the folder's remote code
    just to learn which tokenizer class to build."""
    import transformers

    config = base_config(directory)
    for auto in (transformers.AutoTokenizer, transformers.AutoImageProcessor):
        try:
            return auto.from_pretrained(directory, config=config)
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return None


def load(directory, **kwargs):
    """Load a converted model saved by ``save_pretrained``, with its own head, without remote code."""
    import transformers

    directory = Path(directory)
    data, block = read_linearize_block(directory)
    if block.get("base_model_type") == "timm":
        from .timm_io import load_timm

        return load_timm(directory)
    config = base_config(directory)
    base = getattr(transformers, block["architecture"], None)
    if base is None:
        raise LinearizeError(f"transformers {transformers.__version__} has no class {block['architecture']!r}; "
                             "upgrade transformers")
    from .loading import check_weights

    check_weights(directory, allow_pickle=kwargs.pop("allow_pickle", False))
    model = linearized_hf_class(base).from_pretrained(directory, config=config, use_safetensors=True, **kwargs)
    model.eval()
    return model


def parameter_overhead(model):
    """``(added, base)`` parameter counts of a converted model."""
    block = linearize_config(model) or {}
    added = sum(p.numel() for fm in feature_maps_of(model).values() for p in fm.parameters())
    total = sum(p.numel() for p in model.parameters())
    return added, block.get("parameters_base", total - added)


# ---- checkpoints on disk (what the CLI calls) -----------------------------------------------------

def save_processors(source, directory):
    """Copy the source checkpoint's tokenizer or image processor into ``directory`` (if any)."""
    import transformers

    saved = []
    for auto in (transformers.AutoTokenizer, transformers.AutoImageProcessor):
        try:
            processor = auto.from_pretrained(source)
        except (OSError, ValueError, TypeError, KeyError):
            continue
        processor.save_pretrained(directory)
        saved.append(type(processor).__name__)
    return saved


def convert_checkpoint(model_name, method="luna", out=None, *, layers=None, options=None, overwrite=False,
                       allow_pickle=False, head=None, num_labels=None):
    """Load ``model_name`` (folder, Hub id or alias), convert it and save it to ``out``.

    ``head`` (``linearize.convert.loading.HEADS``) picks the task head to load instead of the
    checkpoint's own architecture (a new head is randomly initialised, ``num_labels`` outputs).
    The folder is written whole or not at all. Returns a summary dict (what ``linearize info``
    prints).
    """
    from ..io import atomic_dir, prepare_output_dir
    from .loading import load_source_model, resolve_model_name

    options = dict(options or {})
    check_method_options(method, options)
    if out is None:
        raise LinearizeError("pass --out DIR: the folder to write the converted model to")
    prepare_output_dir(out, overwrite=overwrite)
    extra = {} if num_labels is None else {"num_labels": int(num_labels)}
    model = load_source_model(model_name, allow_pickle=allow_pickle, head=head, **extra)
    convert(model, method, layers=layers, source=model_name, **options)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        save_processors(resolve_model_name(model_name), tmp)
    return summary(out)


def summary(directory):
    """What a saved converted model is: method, layers, source, parameter overhead."""
    data, block = read_linearize_block(directory)
    added, base = block.get("parameters_added", 0), block.get("parameters_base", 0)
    return {
        "directory": str(directory),
        "architecture": block.get("architecture"),
        "base_model_type": block.get("base_model_type"),
        "model_type": data.get("model_type"),
        "method": block["method"],
        "options": block.get("options", {}),
        "layers": block["layers"],
        "num_attention_layers": block.get("num_attention_layers"),
        "source": block.get("source"),
        "parameters_added": added,
        "parameters_base": base,
        "parameters_added_percent": 100.0 * added / base if base else 0.0,
        "linearize_version": block.get("linearize_version"),
    }
