"""The feature-map base class and the one registry of methods.

A feature map φ: R^d → R^D turns a head's query/key rows into features whose inner product
is the attention kernel (docs/methods.md has every map's formula and paper). Adding a method:

1. write ``linearize/attention/feature_maps/<method>.py`` with a ``FeatureMap`` subclass
   that sets ``name``, ``paper`` and ``feature_dim``, takes its options as keyword arguments
   of ``__init__`` after ``head_dim`` and ``num_heads``, and implements ``forward``;
2. decorate it with ``@register_feature_map`` (duplicates are refused);
3. import it in ``feature_maps/__init__.py`` (and list it in ``MAP_MODULES`` there, which is
   what a saved model's remote code bundles);
4. add its row to ``tests/test_feature_maps.py``'s ``METHOD_CASES``.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ...errors import LinearizeError
from ..core import linear_attention, linear_attention_weights

FEATURE_MAPS: dict = {}


def register_feature_map(cls):
    """Class decorator: add ``cls`` to the registry under ``cls.name``; refuses duplicates."""
    name = getattr(cls, "name", None)
    if not name:
        raise ValueError(f"{cls.__name__} must set a class attribute `name` to be registered")
    if name in FEATURE_MAPS and FEATURE_MAPS[name] is not cls:
        raise ValueError(f"a feature map named {name!r} is already registered ({FEATURE_MAPS[name].__name__})")
    FEATURE_MAPS[name] = cls
    return cls


def methods():
    """The registered method names, in registration order."""
    return list(FEATURE_MAPS)


def method_options(method):
    """``{option: default}`` for a registered method."""
    cls = get_feature_map_class(method)
    params = list(inspect.signature(cls.__init__).parameters.values())[3:]  # self, head_dim, num_heads
    return {p.name: p.default for p in params if p.kind == p.KEYWORD_ONLY or p.kind == p.POSITIONAL_OR_KEYWORD}


def get_feature_map_class(method):
    if method not in FEATURE_MAPS:
        raise LinearizeError(f"unknown method {method!r}; valid methods: {', '.join(methods())}")
    return FEATURE_MAPS[method]


def check_method_options(method, options):
    """``LinearizeError`` listing the valid names if ``method`` is unknown or an option is not its."""
    valid = method_options(method)  # rejects an unknown method
    unknown = sorted(set(options) - set(valid))
    if unknown:
        listed = ", ".join(valid) if valid else "(none)"
        raise LinearizeError(f"unknown option(s) {', '.join(map(repr, unknown))} for method {method!r}; "
                             f"valid options: {listed}")


def create_feature_map(method, head_dim, num_heads=1, **options):
    """Build the feature map of ``method`` for one layer's head geometry.

    Unknown methods and options raise ``LinearizeError`` (a ``ValueError``) listing the valid names.
    """
    check_method_options(method, options)
    return get_feature_map_class(method)(head_dim, num_heads, **options)


class FeatureMap(nn.Module):
    """Base class: ``forward(x, mask=None) -> (features, log_scale)``.

    ``x``: ``[batch, heads, seq, head_dim]`` float32, already multiplied by √scale (q/d^¼).
    ``mask``: ``[batch, seq]`` float32 of real tokens, or None (positional maps use it).
    ``features``: ``[batch, heads, seq, feature_dim]``; ``log_scale``: None, or
    ``[batch, heads, seq, 1]`` with φ(x) = exp(log_scale)·features (see ``core``).
    """

    name: str = ""
    paper: str = ""
    #: the method is exact softmax (no kernel); see ``softmax.py``
    exact_softmax: bool = False
    #: the features of a chunk of tokens can be computed alone (by :meth:`chunk_features`):
    #: inference then runs chunk by chunk over the sequence (``core.linear_attention``)
    chunkable: bool = False
    #: every feature is >= 0 (so every kernel value is): the normaliser needs no sign guard
    nonnegative: bool = False

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__()
        if int(head_dim) < 1 or int(num_heads) < 1:
            raise LinearizeError(f"head_dim and num_heads must be positive, got {head_dim} and {num_heads}")
        self.head_dim = int(head_dim)
        self.num_heads = int(num_heads)
        self.options = dict(options)  # the constructor options, as saved in a model's config
        self.feature_dim = self.head_dim

    def forward(self, x, mask=None):  # pragma: no cover - abstract
        raise NotImplementedError

    def chunk_features(self, x, mask, start):
        """Features of the chunk ``x [B,H,c,d]`` of a sequence whose full ``[B,N]`` mask is
        ``mask``, starting at token ``start``. Only called when :attr:`chunkable`; this default
        is for maps whose φ(x_i) depends on x_i alone."""
        return self(x, mask=mask[:, start:start + x.shape[2]])

    def attend(self, q, k, v, key_padding_mask=None, scale=None, output_attentions=False, dropout=0.0):
        """Attention output ``[B,H,N,d]`` (linear path) and, if asked, Â ``[B,H,N,N]``.

        ``dropout`` (attention-probability dropout) only applies to exact softmax: the linear
        path never forms the probabilities it would drop. While stage-1 distillation runs,
        ``attend_hook`` (set by ``linearize.distill``, never saved) takes over the call.
        """
        hook = self.__dict__.get("attend_hook")
        if hook is not None:
            return hook(self, q, k, v, key_padding_mask, scale, output_attentions)
        out = linear_attention(q, k, v, self, key_padding_mask, scale)
        weights = linear_attention_weights(q, k, self, key_padding_mask, scale) if output_attentions else None
        return out, weights

    def num_learnable_parameters(self):
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    @staticmethod
    def cast(param, x):
        """A parameter in the compute dtype of ``x`` (features are computed in float32)."""
        return param.to(dtype=x.dtype)

    def extra_repr(self):
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"head_dim={self.head_dim}, num_heads={self.num_heads}, feature_dim={self.feature_dim}" + (f", {opts}" if opts else "")


def seeded_generator(seed):
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed))
    return generator
