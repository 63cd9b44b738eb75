"""The timm backend: ``timm`` VisionTransformer models, saved as safetensors + a JSON config.

A converted timm model gains ``save_pretrained(directory)`` like a converted Hugging Face model, and
``linearize.load(directory)`` rebuilds it: ``timm.create_model(name, pretrained=False, **kwargs)``, the
same conversion, then the saved weights, which must match the model's parameter names exactly (timm's
own ``checkpoint_filter_fn`` only runs on pretrained downloads, never here).
"""

from __future__ import annotations

from pathlib import Path

from ...errors import LinearizeError
from ...outputs import atomic_write_json
from ..loading import check_loading_info, check_weights
from .hf_attention import layer_feature_map
from .timm_attention import is_timm_vit, linearized_class, timm_attention_modules, unpatch

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
_MODEL_CLASSES = {}


def _create_kwargs(model):
    """The ``timm.create_model`` keyword arguments that rebuild ``model``'s geometry."""
    attn = model.blocks[0].attn
    return {"img_size": list(model.patch_embed.img_size), "patch_size": list(model.patch_embed.patch_size),
            "depth": len(model.blocks), "embed_dim": model.embed_dim, "num_heads": attn.num_heads,
            "num_classes": model.num_classes, "global_pool": model.global_pool,
            "class_token": model.cls_token is not None, "reg_tokens": model.num_reg_tokens,
            "qkv_bias": attn.qkv.bias is not None, "dynamic_img_size": bool(model.dynamic_img_size)}


def save_timm(model, directory, model_name=None, **create_kwargs):
    """Write ``model.safetensors`` and ``config.json`` (timm name, create kwargs, linearize block).

    ``model_name`` defaults to the timm architecture the model was created as; ``create_kwargs`` to the
    geometry read off the model."""
    from safetensors.torch import save_file

    from ...outputs import atomic_path

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model_name = model_name or (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    if not model_name:
        raise LinearizeError("this timm model does not say which architecture it is; pass model_name")
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(directory / WEIGHTS) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    atomic_write_json(directory / CONFIG, {"timm_model": model_name,
                                           "timm_kwargs": create_kwargs or _create_kwargs(model),
                                           "linearize": model.linearize_config})


def _save_pretrained(self, save_directory, model_name=None, **create_kwargs):
    save_timm(self, save_directory, model_name, **create_kwargs)


def _linearized_model_class(base):
    if base not in _MODEL_CLASSES:
        _MODEL_CLASSES[base] = type(f"Linearize{base.__name__}", (base,), {
            "save_pretrained": _save_pretrained, "_linearize_base": base, "__module__": __name__})
    return _MODEL_CLASSES[base]


class TimmBackend:
    name = "timm"

    def matches(self, model):
        return is_timm_vit(model)

    def attention_modules(self, model):
        return timm_attention_modules(model)

    def sliding_window_layers(self, model):
        return []  # timm's VisionTransformer attends globally in every block

    def record(self, model, source):
        base = getattr(type(model), "_linearize_base", type(model))
        return {"source": source, "base_model_type": "timm", "architecture": base.__name__}

    def attach(self, model, method, layers, options, hybrid=None):
        for index, (_, module) in enumerate(self.attention_modules(model)):
            if index not in layers:
                continue
            module.linearize_map = layer_feature_map(module, index, method, options, module.head_dim,
                                                     module.num_heads, hybrid)
            module.__class__ = linearized_class(type(module))
        model.__class__ = _linearized_model_class(type(model))

    def store_record(self, model, record):
        """The record lives on the model as its versioned block (``linearize_config``, what config.json holds)."""
        model.linearize_config = record.to_block()

    def detach(self, model):
        for _, module in self.attention_modules(model):
            unpatch(module)
        model.__class__ = getattr(type(model), "_linearize_base", type(model))
        if hasattr(model, "linearize_config"):
            del model.linearize_config

    def save(self, model, directory):
        save_timm(model, directory)

    def load(self, directory, data, record, **kwargs):
        import timm
        from safetensors.torch import load_file

        if "timm_model" not in data:
            raise LinearizeError(f"{directory} is not a saved timm model (config.json has no 'timm_model')")
        check_weights(directory)
        model = timm.create_model(data["timm_model"], pretrained=False, **data.get("timm_kwargs", {}))
        self.attach(model, record.method, set(record.layers), record.options, record.hybrid)
        self.store_record(model, record)
        result = model.load_state_dict(load_file(str(Path(directory) / WEIGHTS)), strict=False)
        check_loading_info(directory, {"missing_keys": result.missing_keys, "unexpected_keys": result.unexpected_keys})
        return model.eval()
