"""What a run leaves on disk: saved models, the run folder's ``state.json`` (:class:`RunState`,
resume), the recipe comparison that guards it, hard-linked shared teachers, and clean-up of
finished stages' resume checkpoints."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..errors import LinearizeError
from ..io import atomic_dir, atomic_write_json
from ..training.trackers import LOGS_DIR


TEACHER_KEYS = ("model", "head", "task", "data", "position_init", "teacher", "seed")  # what a shared teacher must match


class RunState:
    """``state.json`` of a run folder: which stages are finished, with their results."""

    def __init__(self, out_dir, recipe):
        self.path = Path(out_dir) / "state.json"
        self.data = json.loads(self.path.read_text()) if self.path.is_file() else {}
        if recipe is not None and self.data:
            difference = recipe_difference(self.data.get("recipe") or {}, comparable(recipe))
            if difference is not None:
                raise LinearizeError(f"{out_dir} holds a run of a different recipe ({difference}); "
                                     f"{self._refusal_advice(out_dir, comparable(recipe))}")
            self.data["recipe"] = comparable(recipe)  # keys added since, at their defaults
        self.data.setdefault("recipe", comparable(recipe))
        self.data.setdefault("stages", {})

    def _refusal_advice(self, out_dir, recipe):
        """What to do about a run folder of another recipe: reuse its teacher when it serves."""
        saved = self.data.get("recipe") or {}
        if "teacher" in self.data.get("stages", {}) and recipe_difference(
                {k: saved.get(k) for k in TEACHER_KEYS}, {k: recipe.get(k) for k in TEACHER_KEYS}) is None:
            return (f"run into another --out with --teacher-from {out_dir} to reuse its fine-tuned teacher, "
                    "or pass --overwrite to start over")
        return "choose another --out (--teacher-from reuses a finished run's teacher), or pass --overwrite to start over"

    def done(self, stage):
        return stage in self.data["stages"]

    def get(self, stage):
        return self.data["stages"][stage]

    def finish(self, stage, result):
        """Record ``stage``'s ``result`` (every process; the main one writes ``state.json``)."""
        from ..training import on_main_process

        self.data["stages"][stage] = result
        on_main_process(atomic_write_json, self.path, self.data)


def recipe_difference(saved, current, defaults=None, path=""):
    """The first setting in which two resolved recipes differ, as ``"key: saved -> current"``, or
    None. A key missing from ``saved`` (a run folder written before the key existed) counts as
    its default (:data:`linearize.recipes.DEFAULTS`); so does a feature-map option missing from
    the run's ``options`` (the method's own default: ``{}`` and ``{"shared_projections": True}``
    are the same LUNA)."""
    from ..recipes import DEFAULTS

    defaults = DEFAULTS if defaults is None else defaults
    for key in sorted(set(saved) | set(current), key=str):
        default = defaults.get(key) if isinstance(defaults, dict) else None
        old, new = saved.get(key, default), current.get(key, default)
        if key == "options" and not path and isinstance(old, dict) and isinstance(new, dict):
            found = _options_difference(current.get("method"), old, new)
        elif isinstance(old, dict) and isinstance(new, dict) and key != "quick":
            found = recipe_difference(old, new, default if isinstance(default, dict) else {}, f"{path}{key}.")
        else:
            found = f"{path}{key}: {old!r} -> {new!r}" if old != new else None
        if found is not None:
            return found
    return None


def _options_difference(method, old, new):
    """The first feature-map option of ``method`` that differs, a missing one at its default."""
    method_defaults = _option_defaults(method)
    old, new = {**method_defaults, **old}, {**method_defaults, **new}
    for option in sorted(set(old) | set(new), key=str):
        if old.get(option) != new.get(option):
            return f"options.{option}: {old.get(option)!r} -> {new.get(option)!r}"
    return None


def _option_defaults(method):
    """``{option: default}`` of ``method`` as a recipe records them, or ``{}`` (no such method)."""
    from ..attention import method_options

    try:
        return comparable(method_options(method))
    except (ValueError, TypeError):
        return {}


def comparable(recipe):
    """``recipe`` (or a result) as JSON reads it back: what ``state.json`` and ``report.json`` hold."""
    return json.loads(json.dumps(recipe, default=str))


def drop_resume_checkpoints(work_dir):
    """Delete a finished stage's resume checkpoints (weights, optimizer state): once ``state.json``
    records the stage and its model is saved they serve nothing, and they are most of a run's disk
    (~350 MB for MiniLM's stage 2). Its ``metrics.jsonl`` (the training curve) and the experiment
    trackers' ``logs`` stay."""
    work_dir = Path(work_dir)
    if not work_dir.is_dir():
        return
    for path in work_dir.iterdir():
        if path.name in ("metrics.jsonl", LOGS_DIR):
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def remove_work_dir(work_dir, out_dir):
    """After a single stage saved its model in ``out_dir``: its training curve (``metrics.jsonl``)
    and the experiment trackers' ``logs`` move into ``out_dir`` and the working folder (resume checkpoints, best weights: hundreds of
    MB) is deleted."""
    work_dir = Path(work_dir)
    if not work_dir.is_dir():
        return
    for kept in ("metrics.jsonl", LOGS_DIR):  # the training curve and the trackers' logs
        if (work_dir / kept).exists():
            os.replace(work_dir / kept, Path(out_dir) / kept)
    shutil.rmtree(work_dir)


def link_or_copy(source, target):
    """``target`` becomes a copy of the folder ``source``, its files hard links where the disk allows."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, copy_function=_hardlink_or_copy)


def _hardlink_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def save_model(model, processor, directory, results=None):
    """Write model, processor and ``{file name: result dict}`` JSON files into ``directory`` atomically."""
    with atomic_dir(directory) as tmp:
        model.save_pretrained(tmp)
        if processor is not None:
            processor.save_pretrained(tmp)
        for name, result in (results or {}).items():
            atomic_write_json(Path(tmp) / name, comparable(result))


def load_saved(directory, converted):
    """A model :func:`save_model` wrote: converted (``linearize.load``) or a softmax checkpoint."""
    import transformers

    import linearize

    if converted:
        return linearize.load(directory)
    config = transformers.AutoConfig.from_pretrained(directory)
    cls = getattr(transformers, config.architectures[0])
    return cls.from_pretrained(directory, use_safetensors=True).eval()
