"""Recipes: YAML files that fix every choice of a `linearize run`.

``load_recipe(name_or_path, overrides)`` reads ``linearize/recipes/<name>.yaml`` (or a YAML
file path), applies ``--quick`` and ``--set key.sub=value`` overrides, and checks every key
against :data:`DEFAULTS` (an unknown key is an error that lists the valid ones). Every key, its
default and its help are defined once, in :mod:`linearize.config`.
"""

from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path

import yaml

from ..config import recipe_defaults
from ..errors import LinearizeError

RECIPE_DIR = Path(__file__).parent
DEFAULT_RECIPE = "minilm-moviereviews"

#: every recipe key with its default, sections as dicts: derived from ``linearize.config.RunConfig``
DEFAULTS = recipe_defaults()


def list_recipes():
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def merge(base, update, path=""):
    """``base`` updated by the nested dict ``update``; an unknown key is an error naming the closest."""
    out = copy.deepcopy(base)
    for key, value in (update or {}).items():
        where = f"{path}{key}"
        if key not in base:
            close = difflib.get_close_matches(str(key), list(base), n=1)
            hint = f"did you mean {path + close[0]!r}? " if close else ""
            raise LinearizeError(f"unknown recipe key {where!r}; {hint}valid keys{' in ' + path[:-1] if path else ''}: "
                                 f"{', '.join(base)}")
        if key == "options" and isinstance(base[key], dict) and isinstance(value, dict):
            out[key] = _merge_free(base[key], value)  # checked against the method when it is built
        elif isinstance(base[key], dict) and key not in ("options", "quick") and base[key] is not None:
            if not isinstance(value, dict):
                raise LinearizeError(f"recipe key {where!r} must be a mapping")
            out[key] = merge(base[key], value, f"{where}.")
        else:
            out[key] = _number_or_value(copy.deepcopy(value))
    return out


def _merge_free(base, update):
    """``base`` updated by ``update``, nested dicts merged, no key checks (feature-map options)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(out.get(key), dict) and isinstance(value, dict):
            out[key] = _merge_free(out[key], value)
        else:
            out[key] = _number_or_value(copy.deepcopy(value))
    return out


def options_for(method, options):
    """The feature-map options a run converts ``method`` with.

    A key of the recipe's ``options`` that names a method holds that method's own options, so one
    recipe serves every method of a ``linearize compare`` (``options: {luna: {projections: 16}}``
    gives LUNA M = 16 and Hedgehog its defaults); the other keys apply to whichever method is
    converted and win over the method's block (``--set options.projections=32``).
    """
    from ..attention import methods

    named = set(methods())
    own = (options or {}).get(method) or {}
    if not isinstance(own, dict):
        raise LinearizeError(f"recipe key 'options.{method}' must be a mapping of {method}'s options, "
                             "e.g. options.luna.projections=16")
    chosen = dict(own)
    chosen.update({k: v for k, v in (options or {}).items() if k not in named})
    return chosen


def parse_options(pairs, example="--option projections=16"):
    """``["k=v", ...]`` -> ``{k: v}`` with YAML scalars (``8`` -> 8, ``true`` -> True, ``1e-2`` ->
    0.01 as in ``--set``): feature-map options from the command line (``--option``,
    ``bench --methods 'luna(k=v,...)'``)."""
    options = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise LinearizeError(f"option {pair!r} is not key=value (example: {example})")
        options[key.strip()] = _scalar(value)
    return options


def parse_set(pairs):
    """``["stage1.lr=1e-2", ...]`` -> a nested override dict (values parsed as YAML scalars)."""
    nested = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise LinearizeError(f"--set {pair!r} is not key=value (example: --set stage1.lr=1e-2)")
        parts = key.strip().split(".")
        cursor = nested
        for part in parts[:-1]:
            cursor = cursor.setdefault(part, {})
        cursor[parts[-1]] = _scalar(value)
    return nested


def _scalar(text):
    """A YAML scalar; numbers YAML 1.1 leaves as strings (``1e-2``, ``5E-5``) become floats
    (here and in recipe files)."""
    if not text.strip():
        return None
    return _number_or_value(yaml.safe_load(text))


def _number_or_value(value):
    if isinstance(value, str) and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+", value.strip()):
        return float(value)
    return value


def load_recipe(name_or_path=None, *, overrides=None, quick=False):
    """The resolved recipe dict (defaults ← YAML ← quick ← overrides)."""
    name_or_path = name_or_path or DEFAULT_RECIPE
    path = Path(name_or_path)
    if not path.suffix:
        path = RECIPE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise LinearizeError(f"no recipe {name_or_path!r}; built-in recipes: {', '.join(list_recipes())} "
                             "(or pass a YAML file)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise LinearizeError(f"{path} is not valid YAML ({str(error).splitlines()[0]})") from None
    recipe = merge(DEFAULTS, data)
    if recipe["name"] is None:
        recipe["name"] = path.stem
    if quick:
        recipe = merge(recipe, recipe.get("quick") or {})
    recipe = merge(recipe, overrides or {})
    recipe["quick_mode"] = bool(quick)
    for key in ("model", "task"):
        if not recipe[key]:
            raise LinearizeError(f"recipe {recipe['name']!r} sets no {key!r}")
    return recipe
