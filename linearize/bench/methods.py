"""The candidates a benchmark compares: softmax's labels and the linear methods, named on the
command line as ``"luna,luna(projections=16,shared_projections=false)"``."""

from __future__ import annotations

from ..errors import LinearizeError

SDPA, EAGER = "sdpa", "eager"
#: SDPA pinned to one of its CUDA kernels (benchmarked beside the dispatching ``sdpa`` on a GPU)
SDPA_FLASH, SDPA_EFFICIENT = "sdpa (flash)", "sdpa (mem-efficient)"
SOFTMAX_LABELS = (SDPA, SDPA_FLASH, SDPA_EFFICIENT, EAGER)


def _split_top_level(text):
    """``text``'s parts between the commas outside parentheses (one level of parentheses)."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise LinearizeError(f"unbalanced parentheses in {text!r} (example: luna,luna(projections=16))")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise LinearizeError(f"unbalanced parentheses in {text!r} (example: luna,luna(projections=16))")
    return parts + [current]


def parse_method_list(text):
    """``"luna,luna(projections=16,shared_projections=false)"`` -> ``["luna", ("luna", {...})]``.

    Commas inside parentheses belong to the options; values are read as YAML scalars.
    """
    from ..recipes import parse_options

    specs = []
    for part in (p.strip() for p in _split_top_level(text)):
        if not part:
            continue
        if "(" not in part:
            specs.append(part)
            continue
        name, _, inner = part.partition("(")
        if not inner.endswith(")"):
            raise LinearizeError(f"{part!r}: nothing may follow the options' ')' (example: luna(projections=16))")
        pairs = [item.strip() for item in inner[:-1].split(",") if item.strip()]
        specs.append((name.strip(), parse_options(pairs, example="luna(projections=16)")))
    return specs


#: keys of a method spec's options that are conversion settings, not the feature map's: hybrid attention
#: (``config.HybridConfig``), e.g. ``hedgehog(window=32,sinks=first+last,hybrid_layers=0+1+2)``
HYBRID_KEYS = ("window", "sinks", "gamma", "hybrid_layers")


def method_specs(methods):
    """``[(label, method, options)]`` from names, ``(name, options)`` pairs, a ``{label: ...}``
    dict or a :func:`parse_method_list` string (None: every registered method but softmax); each
    method's options are checked before any timing, so a typo fails at once. The options may hold
    the hybrid settings :data:`HYBRID_KEYS` (``linearize.convert`` takes them beside the method's)."""
    from ..attention.feature_maps import check_method_options
    from ..attention.feature_maps import methods as registered

    if methods is None:
        methods = [name for name in registered() if name != "softmax"]
    if isinstance(methods, str):
        methods = parse_method_list(methods)
    items = methods.items() if isinstance(methods, dict) else [(None, m) for m in methods]
    specs = []
    for label, spec in items:
        name, options = (spec, {}) if isinstance(spec, str) else (spec[0], dict(spec[1]))
        check_method_options(name, {k: v for k, v in options.items() if k not in HYBRID_KEYS})  # a typo fails now
        if any(key in options for key in HYBRID_KEYS):
            from ..convert.api import hybrid_settings

            hybrid_settings(**{key: options.get(key) for key in HYBRID_KEYS}, method=name)
        label = label or (name if not options else name + "(" + ",".join(f"{k}={v}" for k, v in options.items()) + ")")
        if label in SOFTMAX_LABELS or label in [s[0] for s in specs]:
            raise LinearizeError(f"duplicate or reserved benchmark label {label!r}")
        specs.append((label, name, options))
    return specs
