"""Checkpoint files a stage resumes from, each written atomically: a run killed at any moment
leaves the previous checkpoint whole."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ..io import atomic_path, atomic_write_json

PROGRESS_FILE = "progress.json"


def atomic_torch_save(obj, path):
    """``torch.save`` to a temporary file beside ``path``, then renamed over it."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def clear_checkpoint(accelerator, paths, log):
    """Delete earlier checkpoint files or folders (``resume=False``) on the main process; all wait."""
    existing = [Path(p) for p in paths if Path(p).exists()]
    if existing and accelerator.is_main_process:
        for path in existing:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        log(f"not resuming: removed the earlier checkpoint in {existing[0].parent}")
    accelerator.wait_for_everyone()


def save_accelerator_checkpoint(accelerator, output_dir, progress):
    """Save the whole training state (``accelerator.save_state``) atomically; every process takes part.

    ``progress`` (a JSON-able dict with the finished ``epoch`` and ``step``) is the run's own
    state. ``accelerator.save_state`` fills a temporary folder, which is renamed to
    ``state-<epoch>-<step>``; then ``progress.json`` (``progress``, whose ``state`` names that
    folder), replaced atomically, is the commit point. Older state folders are removed last, so a
    run killed at any moment leaves a ``progress.json`` naming a complete state.
    """
    name = f"state-{progress['epoch']}-{progress['step']}"
    tmp, final = output_dir / f".{name}.tmp", output_dir / name
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while saving
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    progress["state"] = name
    if accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)  # renamed but never committed by a killed run
        os.replace(tmp, final)
        atomic_write_json(output_dir / PROGRESS_FILE, progress)
        for old in [*output_dir.glob("state*"), *output_dir.glob(".state*")]:
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


def load_accelerator_checkpoint(accelerator, output_dir):
    """The ``progress`` dict that :func:`save_accelerator_checkpoint` committed in ``output_dir``,
    with the training state it names loaded into ``accelerator``; ``None`` when there is none."""
    path = output_dir / PROGRESS_FILE
    saved = json.loads(path.read_text()) if path.is_file() else None
    state = output_dir / ((saved or {}).get("state") or "state")  # "state": the folder of older versions
    if saved is None or not state.is_dir():
        return None
    accelerator.load_state(str(state))
    return saved
