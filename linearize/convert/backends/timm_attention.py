"""Patch timm Vision Transformers: every ``timm.layers.Attention`` block.

timm's ``Attention.forward`` calls ``F.scaled_dot_product_attention`` directly (there is no
registry to hook), so a converted block's class is swapped for a subclass whose forward is
timm's own, line for line, with the attention call replaced by the feature map's. Its
projections (``qkv``, ``q_norm``/``k_norm``, ``proj``, the optional gate) are the pretrained
modules, untouched; ``revert`` swaps the class back.
"""

from __future__ import annotations

_SUBCLASSES = {}


def is_timm_vit(model):
    try:
        from timm.models.vision_transformer import VisionTransformer
    except ImportError:  # pragma: no cover - timm is a dependency
        return False
    return isinstance(model, VisionTransformer)


def timm_attention_modules(model):
    from timm.layers import Attention

    return [(name, module) for name, module in model.named_modules() if isinstance(module, Attention)]


def _linearized_forward(self, x, attn_mask=None, is_causal=False):
    """timm ``Attention.forward`` (timm 1.0) with linear attention in place of SDPA."""
    if is_causal:
        raise ValueError("linearize converts bidirectional (encoder) attention; is_causal=True is not supported")
    batch, seq, _ = x.shape
    gate = self.gate(x).sigmoid() if getattr(self, "gate", None) is not None else None
    qkv = self.qkv(x).reshape(batch, seq, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = self.q_norm(q), self.k_norm(k)
    key_padding = None
    if attn_mask is not None:
        from .hf_attention import key_padding_from_mask

        key_padding = key_padding_from_mask(attn_mask if attn_mask.dim() == 4 else attn_mask[:, None])
    out, _ = self.linearize_map.attend(q, k, v, key_padding, scale=self.scale,
                                       dropout=self.attn_drop.p if self.training else 0.0)
    out = out.transpose(1, 2).reshape(batch, seq, self.attn_dim if hasattr(self, "attn_dim") else -1)
    out = self.norm(out)
    if gate is not None:
        out = out * gate
    out = self.proj(out)
    return self.proj_drop(out)


def linearized_class(cls):
    """The subclass of a timm attention class whose forward uses ``self.linearize_map``."""
    if cls not in _SUBCLASSES:
        _SUBCLASSES[cls] = type(f"Linearized{cls.__name__}", (cls,), {"forward": _linearized_forward,
                                                                       "_linearize_base": cls})
    return _SUBCLASSES[cls]


def unpatch(module):
    base = getattr(type(module), "_linearize_base", None)
    if base is not None:
        module.__class__ = base
    if hasattr(module, "linearize_map"):
        del module.linearize_map
