"""Patch Hugging Face encoders through transformers' attention-function registry.

BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA, ViT, DeiT, Dinov2, ModernBERT, UltraBERT, GTE, NomicBERT,
EuroBERT, Jina-embeddings-v3, DINOv3 (ViT) and the CLIP / SigLIP / SigLIP2 vision towers (transformers 5.x)
compute their own Q/K/V projections (and rotary positions, where they have them: the function
receives q and k already rotated) and pass the attention module itself, with ``[B, H, N, d]``
query/key/value, to the function registered under ``config._attn_implementation``. linearize
registers one such function, ``"linearize"``: it looks for a feature map attached to the module
(``module.linearize_map``) and runs linear attention with it; a module without one (a layer left
softmax in a hybrid model) runs exact softmax. The pretrained projections are never copied or
touched. Grouped key/value heads (EuroBERT) are repeated to the query heads, as transformers' own
functions do. A layer that passes ``sliding_window`` (ModernBERT's and UltraBERT's local layers) stays
local: windowed softmax, or windowed kernel attention if converted (``linearize.attention.windowed``);
a causal call is refused. A mask function is registered under the same name: without one, transformers builds no
padding mask for an unknown implementation and padding would silently be ignored. It hands the
attention function the ``[batch, seq]`` key-padding mask (True = real token), never an N×N mask.

A converted model keeps that implementation: :class:`LinearAttentionGuard` refuses any other
(``"sdpa"``, ``"eager"``, flash, flex, a serving engine's own), at load and in
``set_attn_implementation``, since each would silently bypass the feature maps and run the original
softmax. The remote code's config takes ``output_attentions=True`` (:class:`LinearAttentionConfig`),
which the registered function honours. A layer that reaches the function without a feature map and
was not left softmax on purpose (a converted folder built by a plain transformers class) is an error,
not softmax.

This module imports only torch, transformers and ``linearize.attention``, so a saved model's
remote code can bundle it (see ``hf_remote_code.py``).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from ..record import ConversionRecord
from ...attention.core import is_tracing
from ...attention.feature_maps import create_feature_map, get_feature_map_class, method_options, methods
from ...attention.windowed import windowed_attention_weights, windowed_linear_attention, windowed_softmax_attention
from ...errors import LinearizeError

ATTENTION_IMPLEMENTATION = "linearize"
#: set on an attention module that a conversion left softmax (a hybrid model's other layers)
KEPT_SOFTMAX = "linearize_keeps_softmax"

#: model_type -> the class name of its self-attention module (the one that calls the registry)
ATTENTION_CLASSES = {
    "bert": "BertSelfAttention",
    "roberta": "RobertaSelfAttention",
    "xlm-roberta": "XLMRobertaSelfAttention",
    "camembert": "CamembertSelfAttention",
    "distilbert": "DistilBertSelfAttention",
    "albert": "AlbertAttention",
    "electra": "ElectraSelfAttention",
    "vit": "ViTAttention",
    "deit": "DeiTAttention",
    "dinov2": "Dinov2Attention",
    "modernbert": "ModernBertAttention",
    "gte": "GteAttention",
    "nomic_bert": "NomicBertAttention",
    "eurobert": "EuroBertAttention",
    "jina_embeddings_v3": "JinaEmbeddingsV3Attention",
    "dinov3_vit": "DINOv3ViTAttention",
    "clip_vision_model": "CLIPAttention",
    "siglip_vision_model": "SiglipAttention",
    "siglip2_vision_model": "Siglip2Attention",
    "ultrabert": "UltrabertAttention",
}


def key_padding_from_mask(attention_mask):
    """``[batch, seq]`` bool key mask (True = real) from whatever mask the model passes, or None.

    2-D masks come from linearize's mask function; 4-D boolean or additive masks
    (``[B, 1, Nq, Nk]``) from models that build their own are reduced over the query axis.
    """
    if attention_mask is None:
        return None
    mask = attention_mask
    if mask.dim() == 4:
        mask = mask[:, 0]
        mask = mask.any(dim=1) if mask.dtype == torch.bool else (mask > torch.finfo(mask.dtype).min / 2).any(dim=1)
    elif mask.dtype != torch.bool:
        mask = mask > 0
    return _unless_all_real(mask)


def _unless_all_real(mask):
    """None for a mask without padding (eager: the faster unmasked path); a traced graph keeps the
    mask, since its branch cannot depend on the values of an input."""
    return mask if is_tracing() or not bool(mask.all()) else None


def linearize_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                   attention_mask=None, **kwargs):
    """Mask function for the ``linearize`` implementation: the 2-D key-padding mask or None."""
    if attention_mask is None:
        return None
    return _unless_all_real(attention_mask[:, kv_offset: kv_offset + kv_length].to(torch.bool))


def linearize_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                                sliding_window=None, **kwargs):
    """The registered attention function: returns ``(out [B, N, H, d], weights or None)``.

    ``sliding_window`` follows transformers' convention (flash attention's ``window_size =
    (w - 1, w - 1)``): query ``i`` sees keys ``|i - j| ≤ w - 1``."""
    if kwargs.get("is_causal", getattr(module, "is_causal", False)):
        raise LinearizeError("linearize converts bidirectional attention; this layer is causal (a decoder or a "
                             "text tower): convert an encoder or a vision tower")
    fm = getattr(module, "linearize_map", None)
    if fm is None:
        check_kept_softmax(module)
        fm = _softmax_map(module)
    key, value = repeat_key_value_heads(query, key, value)
    padding = key_padding_from_mask(attention_mask)
    # asked for at call time, or at load (config.output_attentions: eager returns its weights always)
    output_attentions = bool(kwargs.get("output_attentions", getattr(getattr(module, "config", None),
                                                                     "output_attentions", False)))
    if sliding_window is not None:
        out, weights = windowed_attend(fm, query, key, value, padding, scaling, int(sliding_window) - 1,
                                       output_attentions, dropout)
    else:
        out, weights = fm.attend(query, key, value, padding, scale=scaling, output_attentions=output_attentions,
                                 dropout=dropout)
    return out.transpose(1, 2).contiguous(), weights


def repeat_key_value_heads(query, key, value):
    """Grouped-query attention: each key/value head repeated for its group of query heads (as
    transformers' ``repeat_kv``: head ``h`` reads key head ``h // group``)."""
    group = query.shape[1] // key.shape[1]
    if group == 1:
        return key, value
    return key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)


def windowed_attend(fm, query, key, value, padding, scale, radius, output_attentions, dropout):
    """A sliding-window layer: exact windowed softmax, or windowed kernel attention with ``fm``'s
    features (``linearize.attention.windowed``); never full attention."""
    if "attend_hook" in fm.__dict__:
        raise LinearizeError("stage-1 attention distillation does not support sliding-window layers yet; convert "
                             "only the global layers (the default, without convert_sliding_window)")
    if fm.exact_softmax:
        return windowed_softmax_attention(query, key, value, radius, padding, scale, dropout, output_attentions)
    out = windowed_linear_attention(query, key, value, fm, radius, padding, scale)
    weights = windowed_attention_weights(query, key, fm, radius, padding, scale) if output_attentions else None
    return out, weights


def check_kept_softmax(module):
    """A converted model's attention layer without a feature map must have been left softmax by the
    conversion; otherwise the model was not built by linearize (a converted folder loaded by a plain
    transformers class, in a process where linearize registered its attention) and would run softmax."""
    if type(module).__name__ in ATTENTION_CLASSES.values() and not getattr(module, KEPT_SOFTMAX, False):
        raise LinearizeError(f"{type(module).__name__} runs linearize's attention without a feature map: the model "
                             "was not built by linearize (a converted folder loaded by a plain transformers class?); "
                             "load the folder with linearize.load(folder) or an Auto class with trust_remote_code=True")


_SOFTMAX = {}


def _softmax_map(module):
    """The exact-softmax path for attention modules that were not converted (hybrid models)."""
    if "map" not in _SOFTMAX:
        _SOFTMAX["map"] = get_feature_map_class("softmax")(1, 1)
    return _SOFTMAX["map"]


def register_attention_backend():
    """Register the ``linearize`` attention and mask functions (idempotent)."""
    AttentionInterface.register(ATTENTION_IMPLEMENTATION, linearize_attention_forward)
    AttentionMaskInterface.register(ATTENTION_IMPLEMENTATION, linearize_mask)


def attention_modules(model):
    """``[(qualified name, module)]`` of the self-attention modules, in forward order."""
    config = getattr(model, "config", None)
    record = ConversionRecord.from_config(config)  # a converted model's model_type is linearize_<base>
    model_type = record.base_model_type if record and record.base_model_type else getattr(config, "model_type", None)
    class_name = ATTENTION_CLASSES.get(model_type)
    if class_name is None:
        return []
    return [(name, module) for name, module in model.named_modules() if type(module).__name__ == class_name]


def sliding_window_layers(model):
    """Indices of the attention modules that attend through a sliding window (ModernBERT's local
    layers: the module's ``sliding_window`` is set)."""
    return [index for index, (_, module) in enumerate(attention_modules(model))
            if getattr(module, "sliding_window", None) is not None]


def head_geometry(config):
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return int(head_dim), heads


def layer_options(method, options, layer_index):
    """Options of one layer: a ``seed`` option is offset by the layer index so layers differ."""
    options = dict(options)
    if "seed" in method_options(method):
        options["seed"] = int(options.get("seed", method_options(method)["seed"])) + layer_index
    return options


def layer_feature_map(module, index, method, options, head_dim, num_heads, hybrid=None):
    """The feature map of attention layer ``index`` (its own seed), on ``module``'s device and dtype;
    ``hybrid`` (``ConversionRecord.hybrid``: window, sinks, gamma, hybrid_layers) makes a global layer's attention
    hybrid (``FeatureMap.make_hybrid``) when it is one of the ``hybrid_layers`` (None: every layer); a
    sliding-window layer stays windowed (it is never hybrid)."""
    fm = create_feature_map(method, head_dim, num_heads, **layer_options(method, options, index))
    chosen = hybrid and (hybrid.get("hybrid_layers") is None or index in hybrid["hybrid_layers"])
    if chosen and getattr(module, "sliding_window", None) is None:
        fm.make_hybrid(hybrid["window"], hybrid["sinks"], hybrid["gamma"])
    reference = next(module.parameters(), None)
    return fm if reference is None else fm.to(device=reference.device, dtype=reference.dtype)


def attach_feature_maps(modules, method, layers, options, head_dim, num_heads, hybrid=None):
    """Create and attach ``module.linearize_map`` for the modules whose index is in ``layers`` (hybrid
    attention with ``hybrid``: :func:`layer_feature_map`); mark the others as left softmax on purpose
    (:data:`KEPT_SOFTMAX`)."""
    for index, (_, module) in enumerate(modules):
        detach_feature_map(module)
        if index in layers:
            module.linearize_map = layer_feature_map(module, index, method, options, head_dim, num_heads, hybrid)
        else:
            setattr(module, KEPT_SOFTMAX, True)


def detach_feature_map(module):
    """Remove what :func:`attach_feature_maps` put on ``module``."""
    if hasattr(module, "linearize_map"):
        del module.linearize_map
    if hasattr(module, KEPT_SOFTMAX):
        delattr(module, KEPT_SOFTMAX)


def apply_linearize_config(model, block):
    """Rebuild a converted model's attention from its config's ``linearize`` block, of any version
    (:class:`ConversionRecord`; used by remote code)."""
    record = ConversionRecord.from_block(block)
    record.check_method(methods())
    register_attention_backend()
    head_dim, num_heads = head_geometry(model.config)
    attach_feature_maps(attention_modules(model), record.method, set(record.layers), record.options, head_dim,
                        num_heads, record.hybrid)
    model.set_attn_implementation(ATTENTION_IMPLEMENTATION)


def linear_attn_implementation(config, requested):
    """The attention implementation of a converted model (``config`` has a ``linearize`` block):
    linearize's own, registered here. ``requested`` (a load's ``attn_implementation``,
    ``set_attn_implementation``'s argument, or a dict of them, whose ``""`` entry is the model's) may be
    None or that name; any other would bypass the feature maps and silently run the original softmax."""
    if isinstance(requested, dict):
        requested = requested.get("", None)
    if requested not in (None, ATTENTION_IMPLEMENTATION):
        record = ConversionRecord.from_config(config)
        method = record.method if record is not None and record.method else "linear"
        raise LinearizeError(f"attn_implementation={requested!r} would replace this converted model's {method} "
                             f"attention by the original softmax; keep {ATTENTION_IMPLEMENTATION!r} (the default). "
                             "For softmax attention, load the source model, or call linearize.revert(model) "
                             "(pip install linearize)")
    register_attention_backend()
    return ATTENTION_IMPLEMENTATION


class LinearAttentionConfig:
    """Mixin of a converted model's config class (the saved remote code's): it takes
    ``output_attentions=True`` (at load: ``from_pretrained(..., output_attentions=True)``), which
    linearize's attention honours as transformers' ``eager`` does (:func:`linearize_attention_forward`
    returns the weights). transformers' own rule allows the flag with ``eager`` only, which would
    bypass the feature maps: the implementation is :class:`LinearAttentionGuard`'s to refuse, with
    its one line. The flag holds for the session and is not saved (transformers' config classes, as
    ``linearize.load`` builds them, refuse a config.json that sets it beside another implementation)."""

    @property
    def output_attentions(self):
        return self._output_attentions

    @output_attentions.setter
    def output_attentions(self, value):
        self._output_attentions = value

    def validate(self):
        """transformers' checks of the config (at save), less its rule on ``output_attentions``."""
        shown, self._output_attentions = self._output_attentions, False
        try:
            getattr(super(), "validate", lambda: None)()
        finally:
            self._output_attentions = shown

    def to_dict(self):
        return {**super().to_dict(), "output_attentions": False}


class LinearAttentionGuard:
    """Mixin of a converted model class (linearize's and the saved remote code's): its attention
    implementation stays linearize's (:func:`linear_attn_implementation`), at construction (a load's
    ``attn_implementation``, or the one a serving engine sets in the config) and in
    ``set_attn_implementation``. A model without a ``linearize`` block is left to transformers."""

    def set_attn_implementation(self, attn_implementation, *args, **kwargs):
        if getattr(self.config, "linearize", None) is not None:
            linear_attn_implementation(self.config, attn_implementation)
        return super().set_attn_implementation(attn_implementation, *args, **kwargs)

    def _check_and_adjust_attn_implementation(self, attn_implementation, *args, **kwargs):
        # transformers' check of the implementation, at __init__ and in set_attn_implementation
        if getattr(self.config, "linearize", None) is None:
            return super()._check_and_adjust_attn_implementation(attn_implementation, *args, **kwargs)
        return linear_attn_implementation(self.config, attn_implementation)
