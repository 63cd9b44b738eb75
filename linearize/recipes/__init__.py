"""Recipes: YAML files that fix every choice of a `linearize run`.

``load_recipe(name_or_path, overrides)`` reads ``linearize/recipes/<name>.yaml`` (or a YAML
file path), applies ``--quick`` and ``--set key.sub=value`` overrides, checks every key
against :data:`DEFAULTS` (an unknown key is an error that lists the valid ones) and returns the
checked :class:`~linearize.config.RunConfig`. Every key, its
default and its help are defined once, in :mod:`linearize.config`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..config import merge, recipe_defaults, yaml_number  # noqa: F401  (merge: part of this module's API)
from ..errors import LinearizeError

RECIPE_DIR = Path(__file__).parent
DEFAULT_RECIPE = "minilm-moviereviews"

#: every recipe key with its default, sections as dicts: derived from ``linearize.config.RunConfig``
DEFAULTS = recipe_defaults()


def list_recipes():
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def parse_options(pairs, example="--option projections=16"):
    """``["k=v", ...]`` -> ``{k: v}`` with YAML scalars (``8`` -> 8, ``true`` -> True, ``1e-2`` ->
    0.01 as in ``--set``): feature-map options from the command line (``--option``,
    ``bench --methods 'luna(k=v,...)'``)."""
    options = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise LinearizeError(f"option {pair!r} is not key=value (example: {example})")
        if not value.strip():  # a method option has no "unset": its default is what leaving it out gives
            raise LinearizeError(f"option {pair!r} has no value: give one (example: {example}), or leave the option "
                                 "out for its default")
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


def _own_corpus_replaces_documents(recipe, recipe_file, overrides):
    """A recipe file's ``data.train_documents`` adds whole reviews to its task's default corpus; the user's own
    corpus (a data file or folder in ``overrides``) or another task replaces that corpus, and the reviews go with
    it, unless the overrides set ``train_documents`` themselves (then the config's check answers)."""
    given = overrides.get("data") or {}
    if not recipe["data"].get("train_documents") or "train_documents" in given:
        return recipe
    from ..data import CORPUS_OPTIONS

    own = any(given.get(name) is not None for name in CORPUS_OPTIONS)
    if own or overrides.get("task") not in (None, recipe_file.get("task")):
        recipe["data"] = {**recipe["data"], "train_documents": False}
    return recipe


def _scalar(text):
    """A YAML scalar; numbers YAML 1.1 leaves as strings (``1e-2``, ``5E-5``) become floats
    (here and in recipe files)."""
    if not text.strip():
        return None
    return yaml_number(yaml.safe_load(text))


def check_option_blocks(overrides, methods):
    """A one-line ``LinearizeError`` when ``overrides`` (``--set``) set a method's own options block,
    ``options.<method>.*``, for a method the command does not convert (``methods``): it could not take
    effect. (A recipe file may hold blocks for every method it is compared with; a user's override names
    what they mean to change.)"""
    from ..attention.feature_maps import methods as all_methods

    named = set(all_methods())
    for key in (overrides or {}).get("options") or {}:
        if key in named and key not in methods:
            raise LinearizeError(f"--set options.{key}.* sets {key}'s options, but this converts with "
                                 f"{', '.join(methods)}: set the options of a method it converts, or convert with "
                                 f"{key} (--method {key})")


def load_recipe(name_or_path=None, *, overrides=None, quick=False, check_model=True):
    """The checked :class:`~linearize.config.RunConfig` of a recipe (defaults ← YAML ← quick ←
    overrides): checked once, here, before anything runs (``RunConfig.validate``; ``check_model=False``:
    all but the model name, for a reader of the recipe's method settings alone)."""
    from ..config import RunConfig

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
    if not isinstance(data, dict):
        raise LinearizeError(f"{path} holds a YAML {type(data).__name__}, not a recipe: a recipe is a mapping of keys "
                             "(model: ..., task: ..., method: ...), as in linearize/recipes/*.yaml")
    recipe = merge(DEFAULTS, data)
    if recipe["name"] is None:
        recipe["name"] = path.stem
    if quick:
        recipe = merge(recipe, recipe.get("quick") or {})
    recipe = _own_corpus_replaces_documents(merge(recipe, overrides or {}), data, overrides or {})
    for key in ("model", "task"):
        if not recipe[key]:
            raise LinearizeError(f"recipe {recipe['name']!r} sets no {key!r}")
    return RunConfig.from_recipe({**recipe, "quick_mode": bool(quick)}).validate(check_model)
