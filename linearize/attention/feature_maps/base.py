"""The feature-map base class, its options and the one registry of methods.

A feature map φ: R^d → R^D turns a head's query/key rows into features whose inner product
is the attention kernel (docs/methods.md has every map's formula and paper). Adding a method is
one new file and one test row:

1. write ``linearize/attention/feature_maps/<method>.py`` (every module of this package is
   imported, and bundled into a saved model's remote code, automatically) with

   - a ``@dataclass`` subclass of :class:`MethodOptions`, one ``field(default=...,
     metadata={"help": ..., "range": at_least(1)})`` per option, a ``range`` for every number (name
     it ``<Method>Options``: the remote code puts every module in one file, so module-level names
     must not collide);
   - a ``FeatureMap`` subclass decorated with ``@register_feature_map`` (duplicates are
     refused) that sets ``name``, ``paper``, ``options_class``, ``card_note`` (its paragraph of
     a pushed model's card), ``in_default_comparison`` (whether ``linearize compare`` runs it
     by default) and ``order`` (its place in ``linearize methods``), reads its options from
     ``self.settings`` and implements ``forward``;

2. add its row to ``tests/test_feature_maps.py``'s ``METHOD_MATRIX`` (name, options, has learnable
   parameters), at its ``order``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from ...errors import LinearizeError, OptionError
from ...field_types import check_field_types
from ..core import DEFAULT_EPS, is_tracing, linear_attention, linear_attention_weights, normalised_kernel_rows
from ..hybrid import (hybrid_attention, hybrid_attention_weights, hybrid_block_rows, initial_log_gamma,
                      parse_sinks)

FEATURE_MAPS: dict = {}


def at_least(low):
    """A range (an option field's metadata ``"range"``: a ``(test, text)`` pair, as
    ``linearize.config.LIMITS`` holds a setting's): ``low`` or more."""
    return (lambda value: value >= low), f">= {low}"


def above(low):
    """A range: more than ``low``."""
    return (lambda value: value > low), f"> {low}"


def one_of(*names):
    """A range: one of ``names``."""
    return (lambda value: value in names), " | ".join(names)


def check_field_ranges(config, where=""):
    """``OptionError`` (one line) if a field of the dataclass instance ``config`` holds a value
    outside the range its metadata states (``"range"``: :func:`at_least`, :func:`above`,
    :func:`one_of`); None passes (the type check decides whether it may be None)."""
    for item in dataclasses.fields(config):
        limit, value = item.metadata.get("range"), getattr(config, item.name)
        if limit is not None and value is not None and not isinstance(value, bool) and not limit[0](value):
            raise OptionError(f"{where}{item.name} must be {limit[1]}, got {value!r}")


def check_dimension(name, value, where=""):
    """``value`` as a positive ``int``; ``OptionError`` (one line) for anything else: a float (32.5
    is not silently 32), a bool, zero or less."""
    try:  # what operator.index takes (an int, a numpy integer), not a float; bools are no dimension
        number = None if isinstance(value, bool) else value.__index__()
    except (AttributeError, TypeError):
        number = None
    if number is None or number < 1:
        raise OptionError(f"{where}{name} must be a positive integer, got {value!r}")
    return number


@dataclass
class MethodOptions:
    """A method's options: subclass it with one ``field(default=..., metadata={"help": ...,
    "range": ...})`` per option. The values are checked against the field types and ranges on
    construction, so a run refuses them before any stage runs."""

    def __post_init__(self):
        check_field_types(self, "option ")
        check_field_ranges(self, "option ")


def option_help(options_class):
    """``[(option, default, help)]`` of a method's options dataclass, in field order."""
    return [(f.name, f.default, f.metadata.get("help", "")) for f in dataclasses.fields(options_class)]


def register_feature_map(cls):
    """Class decorator (``@register_feature_map``, no arguments): add ``cls``, a :class:`FeatureMap` subclass, to
    the registry under ``cls.name``; refuses anything else, and duplicates."""
    if not (isinstance(cls, type) and issubclass(cls, FeatureMap)):
        raise TypeError(f"register_feature_map decorates a FeatureMap subclass (@register_feature_map above its "
                        f"class statement, no arguments), got {cls!r}")
    name = getattr(cls, "name", None)
    if not name:
        raise ValueError(f"{cls.__name__} must set a class attribute `name` to be registered")
    if name in FEATURE_MAPS and FEATURE_MAPS[name] is not cls:
        raise ValueError(f"a feature map named {name!r} is already registered ({FEATURE_MAPS[name].__name__})")
    FEATURE_MAPS[name] = cls
    return cls


def methods():
    """The registered method names, by their ``order`` (then name)."""
    return sorted(FEATURE_MAPS, key=lambda name: (FEATURE_MAPS[name].order, name))


def default_comparison():
    """The methods ``linearize compare`` runs when none are named (``in_default_comparison``)."""
    return [name for name in methods() if FEATURE_MAPS[name].in_default_comparison]


def method_notes():
    """``{first method: (methods, paragraph)}``: the model-card paragraphs (``card_note``), the
    methods that share a paragraph grouped under it."""
    notes = {}
    for name in methods():
        note = FEATURE_MAPS[name].card_note
        family = next((key for key, (_, text) in notes.items() if text == note), name)
        notes[family] = (notes.get(family, ((), note))[0] + (name,), note)
    return notes


def method_options(method):
    """``{option: default}`` for a registered method."""
    return {name: default for name, default, _ in option_help(get_feature_map_class(method).options_class)}


def get_feature_map_class(method):
    if method not in FEATURE_MAPS:
        raise OptionError(f"unknown method {method!r}; valid methods: {', '.join(methods())}")
    return FEATURE_MAPS[method]


def method_settings(method, options):
    """The options dataclass of ``method`` holding ``options``; ``OptionError`` (listing the valid
    names) for an unknown method or option, or a value of the wrong type or out of its range."""
    return settings_of(get_feature_map_class(method), options)


def settings_of(cls, options):
    """``cls.options_class(**options)``, refusing an unknown option or a badly typed or
    out-of-range value."""
    valid = [name for name, _, _ in option_help(cls.options_class)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        listed = ", ".join(valid) if valid else "(none)"
        raise OptionError(f"unknown option(s) {', '.join(map(repr, unknown))} for method {cls.name!r}; "
                          f"valid options: {listed}")
    try:
        return cls.options_class(**options)
    except OptionError as error:
        raise OptionError(f"{cls.name}: {error}") from None


def check_method_options(method, options):
    """``OptionError`` (a ``ValueError``) if ``method`` is unknown, an option is not its, or a
    value has the wrong type or is out of its range."""
    method_settings(method, options)


def check_conversion_options(method, options):
    """:func:`check_method_options`, and a one-line ``OptionError`` for options that conversion cannot honour
    (:meth:`FeatureMap.conversion_problem`): a setting that would not take effect is an error, not a no-op."""
    problem = get_feature_map_class(method).conversion_problem(method_settings(method, options))
    if problem:
        raise OptionError(f"{method}: {problem}")


def options_for(method, options):
    """The feature-map options a run converts ``method`` with.

    A key of the recipe's ``options`` that names a method holds that method's own options, so one
    recipe serves every method of a ``linearize compare`` (``options: {luna: {projections: 16}}``
    gives LUNA M = 16 and Hedgehog its defaults); the other keys apply to whichever method is
    converted and win over the method's block (``--set options.projections=32``).
    """
    named = set(methods())
    own = (options or {}).get(method) or {}
    if not isinstance(own, dict):
        raise LinearizeError(f"recipe key 'options.{method}' must be a mapping of {method}'s options, "
                             "e.g. options.luna.projections=16")
    chosen = dict(own)
    chosen.update({k: v for k, v in (options or {}).items() if k not in named})
    return chosen


def create_feature_map(method, head_dim, num_heads=1, **options):
    """Build the feature map of ``method`` for one layer's head geometry.

    Unknown methods and options, badly typed or out-of-range values, and a ``head_dim`` or
    ``num_heads`` that is not a positive integer raise ``OptionError``.
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
    #: ``forward`` takes ``out=``: a ``[B,H,N,D]`` float32 buffer (stored head-major, see
    #: :func:`per_head_matmul`) to write the features into, in inference (the chunked path's
    #: reused buffers, ``core.scratch``); it may still return a new tensor instead
    writes_out: bool = False
    #: ``forward`` takes ``input_scale=`` (a float): the features of ``input_scale · x``, the factor folded into
    #: the map's first per-head product, so the chunked path passes a batch of one sequence's ``x`` as the
    #: strided view it is, with no scaled copy (``core.features_of_chunk``)
    folds_input_scale: bool = False
    #: ``forward`` takes ``log_scale=False``: the caller drops the features' log-scale (a query's cancels in the
    #: normalised output: ``core.feature_maps``), so a log-scaled map skips what only that scale needs
    #: (DARKFormer's ‖Mx‖² columns, Performer's ‖x‖², Flexformer's envelope) and returns None for it; the
    #: features themselves are the same
    skips_log_scale: bool = False
    #: the dataclass of the method's options (defaults and help text live there)
    options_class: type = MethodOptions
    #: the method's paragraph in a pushed model's card (methods with the same text share it)
    card_note: str = ""
    #: ``linearize compare`` runs the method when no methods are named
    in_default_comparison: bool = False
    #: its place in ``linearize.methods()`` (ties by name): a new method comes after the others
    order: int = 100
    #: hybrid attention (:meth:`make_hybrid`): the exact window's block size R (0: no window) and the
    #: sink tokens kept exact beside it; neither: pure linear attention
    window: int = 0
    sinks: tuple = ()
    #: γ's start in hybrid attention when none is given: the best single γ before training with a window and a
    #: sink, measured per method (docs/experiments/hybrid, "γ at initialisation"); 0.1 (Hedgehog's) for the
    #: maps that set none (measured: Hedgehog, LUNA; not measured: the fixed maps, cosFormer)
    initial_gamma: float = 0.1

    def __init__(self, head_dim, num_heads=1, **options):
        super().__init__()
        self.head_dim = check_dimension("head_dim", head_dim, f"{self.name}: ")
        self.num_heads = check_dimension("num_heads", num_heads, f"{self.name}: ")
        self.settings = settings_of(type(self), options)  # the options dataclass
        self.options = dataclasses.asdict(self.settings)  # every option, as saved in a model's config
        self.feature_dim = self.head_dim

    def forward(self, x, mask=None):  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def conversion_problem(cls, settings):
        """Why ``linearize.convert`` cannot honour these options (``settings``, the options dataclass), or None:
        an option only the Python API can give effect to."""
        return None

    def chunk_features(self, x, mask, start, **given):
        """Features of the chunk ``x [B,H,c,d]`` of a sequence whose full ``[B,N]`` mask is
        ``mask``, starting at token ``start``. Only called when :attr:`chunkable`; this default
        is for maps whose φ(x_i) depends on x_i alone. ``given``: ``out`` and ``input_scale``, passed on to
        a map that :attr:`writes_out` / :attr:`folds_input_scale`."""
        return self(x, mask=mask[:, start:start + x.shape[2]], **given)

    def make_hybrid(self, window, sinks=(), gamma=None):
        """Make this map's layer hybrid (``linearize.attention.hybrid``): exact softmax over the keys of
        each query's block of ``window`` tokens and the two neighbouring blocks and over the ``sinks``,
        linear attention over the others, mixed by a
        learned ``γ`` per head that starts at ``gamma`` (default :attr:`initial_gamma`; stored as
        ``hybrid_log_gamma``). ``window`` 0
        is no window (the sinks alone are exact); with no sinks either the layer stays pure linear
        attention."""
        window, sinks = int(window), parse_sinks(sinks)
        gamma = self.initial_gamma if gamma is None else gamma
        if window < 0 or float(gamma) <= 0:
            raise OptionError(f"{self.name}: window must be >= 0 and gamma > 0, got window={window}, gamma={gamma}")
        if (window or sinks) and self.exact_softmax:
            raise OptionError("a window or sinks make part of a linear method's attention exact; softmax is exact "
                              "already")
        self.window, self.sinks = window, sinks
        if self.is_hybrid:
            self.hybrid_log_gamma = nn.Parameter(initial_log_gamma(self.num_heads, gamma))
        return self

    @property
    def is_hybrid(self):
        """The layer's attention is hybrid: an exact window, or sinks, beside the linear attention."""
        return bool(self.window or self.sinks)

    def hybrid_gamma(self):
        """γ per head ``[H]`` (float32) of a hybrid map."""
        return self.hybrid_log_gamma.float().exp()

    def attend(self, q, k, v, key_padding_mask=None, scale=None, output_attentions=False, dropout=0.0):
        """Attention output ``[B,H,N,d]`` (linear or hybrid path) and, if asked, its rows ``[B,H,N,N]``.

        ``dropout`` (attention-probability dropout) only applies to exact softmax: the linear
        path never forms the probabilities it would drop. While stage-1 distillation runs,
        ``attend_hook`` (set by ``linearize.distill``, never saved) takes over the call.
        """
        hook = self.__dict__.get("attend_hook")
        if hook is not None:
            return hook(self, q, k, v, key_padding_mask, scale, output_attentions)
        if self.is_hybrid:
            out = hybrid_attention(q, k, v, self, self.window, self.sinks, self.hybrid_gamma(), key_padding_mask, scale)
        else:
            out = linear_attention(q, k, v, self, key_padding_mask, scale)
        return out, self.attention_weights(q, k, key_padding_mask, scale) if output_attentions else None

    def attention_weights(self, q, k, key_padding_mask=None, scale=None):
        """The layer's attention rows ``[B,H,N,N]`` (float32): the normalised kernel rows, or the
        hybrid rows of a hybrid map (what ``output_attentions`` returns and stage 1 distils)."""
        if self.is_hybrid:
            return hybrid_attention_weights(q, k, self, self.window, self.sinks, self.hybrid_gamma(), key_padding_mask,
                                            scale)
        return linear_attention_weights(q, k, self, key_padding_mask, scale)

    def block_rows(self, q, k, phi_q, phi_k, key_mask, start, scale=None, eps=DEFAULT_EPS):
        """The rows of :meth:`attention_weights` for the query rows ``start .. start + b`` only (``q``
        ``[B,H,b,d]`` and their features), from the features of ``core.feature_maps``: stage 1's blocks."""
        if self.is_hybrid:
            return hybrid_block_rows(q, k, phi_q, phi_k, key_mask, start, self.window, self.sinks,
                                     self.hybrid_gamma(), scale, eps)
        return normalised_kernel_rows(phi_q, phi_k, key_mask, eps)

    def num_learnable_parameters(self):
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def probe(self, inputs):
        """The data of this map's report figure for ``inputs`` (the ``x`` tensors its forward
        received on a batch), as plain lists, or None: a map without a figure of its own."""
        return None

    def reused(self, name, dtype, build, *params, input_scale=None):
        """``build()``: a small tensor made from the parameters ``params`` in ``dtype`` (a stacked or
        scaled weight), kept while they stay unchanged, so inference makes it once, not once per
        chunk and call; rebuilt whenever autograd may want its graph, and in a traced graph. With
        ``input_scale`` s (a map that :attr:`folds_input_scale`): ``s · build()``, kept apart for each s."""
        if input_scale is not None:
            name, unscaled = f"{name}×{input_scale!r}", build

            def build():
                return unscaled() * input_scale
        if is_tracing() or (torch.is_grad_enabled() and any(p.requires_grad for p in params)):
            return build()
        # in the instance's dict (not a buffer: never saved), clear of its methods
        return kept_while_unchanged(self, f"_reused_{name}", (dtype,), build, params)

    @staticmethod
    def cast(param, x):
        """A parameter in the compute dtype of ``x`` (features are computed in float32)."""
        return param.to(dtype=x.dtype)

    def extra_repr(self):
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"head_dim={self.head_dim}, num_heads={self.num_heads}, feature_dim={self.feature_dim}" + (f", {opts}" if opts else "")


def kept_while_unchanged(owner, name, key, build, params):
    """``build()``, kept in ``owner.__dict__[name]`` while ``key`` and the values of ``params`` stay the same.

    A parameter's version counter says whether it changed. Parameters made under ``torch.inference_mode``
    (a model converted there) have none: theirs are compared whole with a copy kept beside the value (a
    few thousand numbers), so such a model reuses what it built too, instead of rebuilding it on every call.
    The value is built outside inference mode and without autograd, usable in and out of both."""
    inference = any(p.is_inference() for p in params)
    full_key = key + tuple((p.data_ptr(), p.device, None if inference else p._version) for p in params)
    cached = owner.__dict__.get(name)
    if cached is not None and cached[0] == full_key and all(torch.equal(a, b) for a, b in zip(cached[2], params)):
        return cached[1]
    with torch.inference_mode(False), torch.no_grad():
        value = build()
        copies = tuple(p.detach().clone() for p in params) if inference else ()
    owner.__dict__[name] = (full_key, value, copies)
    return value


def per_head_matmul(x, weight, out):
    """``x [B,H,N,d]`` times ``weight [H,d,D]`` per head into ``out [B,H,N,D]`` (no autograd), as
    one ``bmm`` over the heads with batch and tokens as its rows: no copy of the weight per batch
    element (a broadcast ``matmul`` makes one), and none of ``x`` or ``out`` when they are stored
    head-major (``[H,B,N,·]`` underneath, as the chunked path's buffers are)."""
    batch, heads, seq, dim = x.shape
    rows = x.transpose(0, 1).reshape(heads, batch * seq, dim)
    target = out.transpose(0, 1)
    if target.is_contiguous():
        torch.bmm(rows, weight, out=target.view(heads, batch * seq, -1))
    else:
        out.copy_(torch.bmm(rows, weight).view(heads, batch, seq, -1).transpose(0, 1))
    return out


def seeded_generator(seed):
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed))
    return generator
