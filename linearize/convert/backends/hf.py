"""The Hugging Face backend: transformers encoders, patched through the attention-function registry.

The registry patch itself (``hf_attention.py``) is bundled into every saved model's remote code; this
module holds what only linearize needs: the converted class, its ``save_pretrained`` and ``load``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from ...errors import LinearizeError
from ...outputs import atomic_write_json
from .. import sentence_transformers
from ..loading import check_loading_info, check_weights, read_conversion_record
from ..record import ConversionRecord
from . import hf_attention
from . import hf_remote_code as remote_code

_SUBCLASSES = {}
_CONFIG_SUBCLASSES = {}


def _version():
    from ...version import __version__

    return __version__


def _own_config(model):
    """Give the model a private copy of its config: conversion writes to it, and a config
    object shared with other models (``from_config(c)`` twice) must not convert them too."""
    old = model.config
    new = copy.deepcopy(old)
    for module in model.modules():
        if getattr(module, "config", None) is old:
            module.config = new


def _register_output_recording(model):
    """transformers keys ``output_attentions`` capture on the class name (set in ``__init__``,
    which a class swapped in place never ran): register the new class like the old one."""
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # pragma: no cover - older/newer transformers without the registry
        return
    _CAN_RECORD_REGISTRY[model] = model._can_record_outputs


class HFBackend:
    name = "hf"

    def matches(self, model):
        from transformers import PreTrainedModel

        return isinstance(model, PreTrainedModel)

    def attention_modules(self, model):
        modules = hf_attention.attention_modules(model)
        if getattr(model.config, "is_decoder", False):
            raise LinearizeError("linearize converts bidirectional encoders; this model is configured as a decoder")
        return modules

    def sliding_window_layers(self, model):
        return hf_attention.sliding_window_layers(model)

    def record(self, model, source):
        from ..heads import head_for_class

        source = source or getattr(model.config, "_name_or_path", None) or None
        # a sentence-transformers model keeps its modules, as the encoder it is: a task head put on it
        # (--head sequence-classification) makes a classifier, which its pooling would not serve
        encoder = head_for_class(type(model).__name__) is None
        files = sentence_transformers.read_files(source) if encoder else None
        return {"source": source, "base_model_type": model.config.model_type, "architecture": type(model).__name__,
                "previous_attn_implementation": model.config._attn_implementation,
                "sentence_transformers_files": files or None}

    def attach(self, model, method, layers, options, hybrid=None):
        _own_config(model)
        model.config.__class__ = linearized_config_class(type(model.config))
        head_dim, num_heads = hf_attention.head_geometry(model.config)
        hf_attention.register_attention_backend()
        hf_attention.attach_feature_maps(self.attention_modules(model), method, set(layers), options, head_dim,
                                         num_heads, hybrid)
        model.set_attn_implementation(hf_attention.ATTENTION_IMPLEMENTATION)
        model.__class__ = linearized_hf_class(type(model))
        _register_output_recording(model)

    def store_record(self, model, record):
        """The record lives in the config as its versioned block (what config.json holds)."""
        model.config.linearize = record.to_block()

    def detach(self, model):
        record = ConversionRecord.from_config(model.config)
        for _, module in hf_attention.attention_modules(model):
            hf_attention.detach_feature_map(module)
        model.__class__ = getattr(type(model), "_linearize_base", type(model))
        model.config.__class__ = getattr(type(model.config), "_linearize_base", type(model.config))
        if record is not None:
            del model.config.linearize
            model.set_attn_implementation(record.previous_attn_implementation or "sdpa")

    def save(self, model, directory):
        model.save_pretrained(directory)

    def load(self, directory, data, record, **kwargs):
        import transformers

        config = _base_config(data, record)
        base = getattr(transformers, record.architecture or "", None)
        if base is None:
            raise LinearizeError(f"transformers {transformers.__version__} has no class {record.architecture!r}; "
                                 "upgrade transformers")
        check_weights(directory, allow_pickle=kwargs.pop("allow_pickle", False))
        flags = {name: kwargs.pop(name) for name in CONFIG_KWARGS if name in kwargs}  # transformers sets these on a
        want_info = kwargs.pop("output_loading_info", False)                        # config it loads: here on ours
        model, info = linearized_hf_class(base).from_pretrained(directory, config=config, use_safetensors=True,
                                                                output_loading_info=True, **kwargs)
        # after construction: a class that builds its base model with AutoModel.from_config(config) finds only
        # transformers' own config classes in its mapping
        model.config.__class__ = linearized_config_class(type(model.config))  # takes output_attentions=True
        for name, value in flags.items():
            setattr(model.config, name, value)
        check_loading_info(directory, info)
        model.eval()
        return (model, info) if want_info else model


#: ``from_pretrained`` keywords that are config settings (``linearize.load(dir, output_hidden_states=True)``)
CONFIG_KWARGS = ("output_attentions", "output_hidden_states", "return_dict")


def linearized_hf_class(base):
    """A subclass of a transformers model class that rebuilds its linear attention from
    ``config.linearize`` on construction (so ``from_pretrained`` restores it), refuses an attention
    implementation that would bypass it (``hf_attention.LinearAttentionGuard``) and saves the
    remote code with the weights."""
    if base not in _SUBCLASSES:
        def __init__(self, config, *args, **kwargs):
            base.__init__(self, config, *args, **kwargs)
            block = getattr(config, "linearize", None)
            if block is not None:
                hf_attention.apply_linearize_config(self, block)

        bases = (hf_attention.LinearAttentionGuard, base)
        _SUBCLASSES[base] = _module_class(type(remote_code.remote_class_name(base.__name__), bases, {
            "__init__": __init__, "save_pretrained": _save_pretrained, "_linearize_base": base,
            "__module__": __name__}))
    return _SUBCLASSES[base]


def linearized_config_class(base):
    """A subclass of a transformers config class that takes ``output_attentions=True`` with linearize's
    attention (``hf_attention.LinearAttentionConfig``; transformers' own rule allows it with ``eager``
    only): a converted model's config, in memory (``convert``) and loaded (``linearize.load``)."""
    base = getattr(base, "_linearize_base", base)
    if base not in _CONFIG_SUBCLASSES:
        _CONFIG_SUBCLASSES[base] = _module_class(type(f"Linearize{base.__name__}", (hf_attention.LinearAttentionConfig,
                                                                                     base),
                                                      {"_linearize_base": base, "__module__": __name__}))
    return _CONFIG_SUBCLASSES[base]


def _module_class(cls):
    """``cls``, made an attribute of this module, so pickle finds it by name (``torch.save(model)``)."""
    globals()[cls.__name__] = cls
    return cls


def __getattr__(name):
    """``Linearize<Class>`` of transformers' ``<Class>`` (a model or a config class), made on first use: what
    unpickling a converted model or its config looks up in a process that has not converted one."""
    import transformers

    base = getattr(transformers, name[len("Linearize"):], None) if name.startswith("Linearize") else None
    if isinstance(base, type):
        hf_attention.register_attention_backend()  # what the unpickled model's attention calls
        config = issubclass(base, transformers.PretrainedConfig)
        return linearized_config_class(base) if config else linearized_hf_class(base)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _save_pretrained(self, save_directory, *args, **kwargs):
    """``save_pretrained`` plus the ``linearize`` config block, own model type and remote code."""
    base = type(self)._linearize_base
    # Weights are written under the model's own (transformers 5.x) parameter names, never reverted
    # to a legacy layout: transformers 5.x renames legacy ViT/DeiT/Dinov2 keys on load through a
    # conversion mapping keyed by the *native* class name, and writes them back under the legacy
    # names on save. A converted folder loads as ``Linearize<Class>`` (linearize.load) or as custom
    # code (trust_remote_code), and neither gets that mapping, so legacy names would come back as
    # UNEXPECTED and the attention projections as MISSING (randomly initialised). Current names load
    # with or without a mapping (its patterns match only legacy names). Older-format tools gain
    # nothing from the legacy layout: a converted folder needs transformers 5.x to run at all.
    kwargs.setdefault("save_original_format", False)
    base.save_pretrained(self, save_directory, *args, **kwargs)
    record = ConversionRecord.from_config(self.config)
    auto_map = remote_code.write_remote_code(save_directory, record.base_model_type,
                                             type(self.config)._linearize_base.__name__, _version())
    path = Path(save_directory) / "config.json"
    data = json.loads(path.read_text())
    data["model_type"] = remote_code.model_type_for(record.base_model_type)
    data["architectures"] = [remote_code.remote_class_name(base.__name__)]
    data["auto_map"] = auto_map
    # A softmax class given this folder explicitly (BertModel.from_pretrained(dir), no remote code)
    # then asks for an attention transformers does not know, and fails, instead of running softmax.
    data["attn_implementation"] = hf_attention.ATTENTION_IMPLEMENTATION
    data["linearize"] = record.to_block()  # versioned on disk, {"_type", "_version", "_data"}
    atomic_write_json(path, data)
    sentence_transformers.write_files(save_directory, record.sentence_transformers_files)


def base_config(directory):
    """The source architecture's own config class for a saved converted model (no remote code)."""
    return _base_config(*read_conversion_record(directory))


def _base_config(data, record):
    """``base_config`` from an already read config.json (``data``) and its conversion record."""
    import transformers

    config_dict = {k: v for k, v in data.items() if k not in ("model_type", "auto_map", "architectures")}
    config_dict.pop("linearize", None)  # set below, in this version's encoding
    config = transformers.AutoConfig.for_model(record.base_model_type, **config_dict)
    config.linearize = record.to_block()
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
