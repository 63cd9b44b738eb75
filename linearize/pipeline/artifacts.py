"""What a run leaves on disk: saved models, the run folder's ``state.json`` (:class:`RunState`,
resume), the recipe comparison that guards it, hard-linked shared teachers, and clean-up of
finished stages' resume checkpoints."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..config import TEACHER_KEYS, RunConfig, config_difference
from ..errors import LinearizeError
from ..report import StageResult
from ..outputs import atomic_dir, atomic_write_json
from ..trackers import LOGS_DIR


#: the entries of ``state.json`` that are a training stage's result (a :class:`StageResult`)
STAGE_RESULTS = ("teacher", "stage1", "stage2")


class RunState:
    """``state.json`` of a run folder: the run's configuration and which stages are finished, with
    their results (:class:`~linearize.report.StageResult`; ``latency``: a plain dict).

    ``config`` (a :class:`~linearize.config.RunConfig`): the run about to continue in the folder;
    a folder holding another configuration is refused in one line (a setting the saved one lacks,
    written before the setting existed, counts as its default). None: only read the folder."""

    def __init__(self, out_dir, config):
        self.path = Path(out_dir) / "state.json"
        self.data = json.loads(self.path.read_text()) if self.path.is_file() else {}
        saved = self.data.get("recipe")
        self.config = RunConfig.from_recipe(saved) if saved else config
        if config is not None and saved:
            difference = config_difference(self.config, config)
            if difference is not None:
                raise LinearizeError(f"{out_dir} holds a run of a different recipe ({difference}); "
                                     f"{self._refusal_advice(out_dir, config)}")
        if config is not None:
            self.config = config
            self.data["recipe"] = comparable(config.to_recipe())  # keys added since, at their defaults
        self.data.setdefault("stages", {})

    def _refusal_advice(self, out_dir, config):
        """What to do about a run folder of another recipe: reuse its teacher when it serves."""
        if self.done("teacher") and config_difference(self.config, config, TEACHER_KEYS) is None:
            return (f"run into another --out with --teacher-from {out_dir} to reuse its fine-tuned teacher, "
                    "or pass --overwrite to start over")
        return "choose another --out (--teacher-from reuses a finished run's teacher), or pass --overwrite to start over"

    def done(self, stage):
        return stage in self.data.get("stages", {})

    def get(self, stage):
        """A finished stage's :class:`StageResult` (``latency``: its dict)."""
        entry = self.data["stages"][stage]
        return StageResult.from_dict(entry) if stage in STAGE_RESULTS else entry

    def finish(self, stage, result):
        """Record ``stage``'s ``result`` (every process; the main one writes ``state.json``)."""
        from ..training import on_main_process

        self.data["stages"][stage] = comparable(result.to_dict() if isinstance(result, StageResult) else result)
        on_main_process(atomic_write_json, self.path, self.data)


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
