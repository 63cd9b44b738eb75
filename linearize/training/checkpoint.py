"""Checkpoint files a stage resumes from, each written atomically: a run killed at any moment
leaves the previous checkpoint whole."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ..errors import LinearizeError
from ..io import atomic_path, atomic_write_json
from .accelerator import on_main_process, wait_for_everyone

PROGRESS_FILE = "progress.json"


def atomic_torch_save(obj, path):
    """``torch.save`` to a temporary file beside ``path``, then renamed over it."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def clear_checkpoint(accelerator, paths, log):
    """Delete earlier checkpoint files or folders (``resume=False``) on the main process; all wait."""
    on_main_process(_remove, [Path(p) for p in paths if Path(p).exists()], log)


def _remove(existing, log):
    for path in existing:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    if existing:
        log(f"not resuming: removed the earlier checkpoint in {existing[0].parent}")


def check_process_count(saved, accelerator, where):
    """Refuse to resume a checkpoint that ``saved`` processes wrote (``None``: not recorded) in a
    run of another number of processes: their shares of every batch, hence the steps, differ."""
    if saved is not None and saved != accelerator.num_processes:
        raise LinearizeError(f"the checkpoint in {where} was written by {saved} process(es) and this run has "
                             f"{accelerator.num_processes}: resume it with {saved} (torchrun --nproc_per_node "
                             f"{saved}), or start afresh (--no-resume; for `linearize run`, --overwrite)")


def save_accelerator_checkpoint(accelerator, output_dir, progress):
    """Save the whole training state (``accelerator.save_state``) atomically; every process takes part.

    ``progress`` (a JSON-able dict with the finished ``epoch`` and ``step``) is the run's own
    state; it gains ``num_processes``. ``accelerator.save_state`` fills a temporary folder, which
    the main process renames to ``state-<epoch>-<step>``; then ``progress.json`` (``progress``,
    whose ``state`` names that folder), replaced atomically, is the commit point. Older state
    folders are removed last, so a run killed at any moment leaves a ``progress.json`` naming a
    complete state.
    """
    name = f"state-{progress['epoch']}-{progress['step']}"
    tmp = output_dir / f".{name}.tmp"
    on_main_process(shutil.rmtree, tmp, ignore_errors=True)  # left by a run killed while saving
    accelerator.save_state(str(tmp))
    wait_for_everyone()  # every process's part of the state (its random states) is written
    progress.update(state=name, num_processes=accelerator.num_processes)
    on_main_process(_commit, output_dir, tmp, name, progress)


def _commit(output_dir, tmp, name, progress):
    """Rename the filled state folder, point ``progress.json`` at it, then remove older states."""
    final = output_dir / name
    shutil.rmtree(final, ignore_errors=True)  # renamed but never committed by a killed run
    os.replace(tmp, final)
    atomic_write_json(output_dir / PROGRESS_FILE, progress)
    for old in [*output_dir.glob("state*"), *output_dir.glob(".state*")]:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)


def load_accelerator_checkpoint(accelerator, output_dir):
    """The ``progress`` dict that :func:`save_accelerator_checkpoint` committed in ``output_dir``,
    with the training state it names loaded into ``accelerator``; ``None`` when there is none. A
    checkpoint of another number of processes is refused (:func:`check_process_count`)."""
    path = output_dir / PROGRESS_FILE
    saved = json.loads(path.read_text()) if path.is_file() else None
    state = output_dir / ((saved or {}).get("state") or "state")  # "state": the folder of older versions
    if saved is None or not state.is_dir():
        return None
    check_process_count(saved.get("num_processes"), accelerator, output_dir)
    accelerator.load_state(str(state))
    return saved
