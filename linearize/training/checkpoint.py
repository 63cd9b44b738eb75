"""The one checkpoint format both stages resume from, written and read by the
:class:`~linearize.training.Trainer` (its ``save_checkpoint``, ``load_checkpoint`` and
``clear_checkpoint``).

A stage's checkpoint folder holds:

- ``checkpoint.json``, the commit point: ``format`` (:data:`CHECKPOINT_FORMAT`), ``state`` (the
  name of the state folder), ``num_processes``, then the :class:`TrainingProgress`: ``step``
  (optimizer steps done), ``epoch`` (epochs finished), ``seconds`` (training time so far),
  ``history`` (the stage's log entries) and ``extra`` (the stage's own JSON-able values: stage
  2's best metric and epoch, its place in the current epoch, ...).
- ``state-<epoch>-<step>/``, the training state it names: ``weights.pt`` (the state dict of what
  trains: stage 1's feature maps only, stage 2's whole model), ``optimizer.pt``,
  ``scheduler.pt``, ``grad_scaler.pt`` (fp16 only) and one ``random_states_<process>.pt`` per
  process (its Python, NumPy, torch and CUDA generators).
- beside them the Trainer's ``metrics.jsonl`` and what a stage keeps of its own (stage 2's best
  weights).

Each file is written atomically into a temporary state folder, which is renamed into place
before ``checkpoint.json`` (replaced atomically) names it; older state folders go last. A run
killed at any moment leaves a ``checkpoint.json`` naming a complete state. The checkpoints of
earlier versions (:data:`EARLIER_FORMAT_FILES`) are not read: a run finding one says so in one
line, removes it and starts afresh.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import LinearizeError
from ..outputs import atomic_path, atomic_write_json, replace_folder
from .accelerator import is_main_process, on_main_process, wait_for_everyone

CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_FORMAT = 1  # raised whenever the layout changes: a checkpoint of another format is not read
WEIGHTS_FILE = "weights.pt"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
SCALER_FILE = "grad_scaler.pt"
#: what the checkpoints of earlier versions left: stage 1's ``stage1_state.pt``, stage 2's
#: ``progress.json`` naming an ``accelerate`` state folder
EARLIER_FORMAT_FILES = ("stage1_state.pt", "progress.json")


def atomic_torch_save(obj, path):
    """``torch.save`` to a temporary file beside ``path``, then renamed over it."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


@dataclass
class TrainingProgress:
    """Where a checkpoint left a stage's training: ``step`` optimizer steps done, ``epoch`` epochs
    finished, ``seconds`` of training so far, the stage's ``history`` (its log entries) and its
    ``extra`` values (JSON-able: what else the stage needs to go on exactly)."""

    step: int = 0
    epoch: int = 0
    seconds: float = 0.0
    history: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)


def random_states():
    """This process's random generators: Python's, NumPy's, torch's CPU one and, with CUDA, every
    CUDA device's (what dropout and any other draw in training consume)."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_random_states(states):
    """Set this process's random generators to ``states`` (:func:`random_states`)."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def random_states_file(process_index):
    """The name of process ``process_index``'s random states in a state folder."""
    return f"random_states_{process_index}.pt"


def write_checkpoint(accelerator, directory, state, progress):
    """Write a checkpoint into ``directory`` (the format of this module); every process takes part.

    ``state``: ``{file name: object}`` that the main process saves in the state folder, to which
    every process adds its random states; ``progress`` (a :class:`TrainingProgress`) goes into
    ``checkpoint.json``, the commit point.
    """
    directory = Path(directory)
    name = f"state-{progress.epoch}-{progress.step}"
    tmp = directory / f".{name}.tmp"
    on_main_process(_make_empty_folder, tmp)  # one left by a run killed while saving is emptied
    if is_main_process():
        for file, obj in state.items():
            atomic_torch_save(obj, tmp / file)
    atomic_torch_save(random_states(), tmp / random_states_file(accelerator.process_index))
    wait_for_everyone()  # every process's part of the state is written
    record = {"format": CHECKPOINT_FORMAT, "state": name, "num_processes": accelerator.num_processes,
              **asdict(progress)}
    on_main_process(_commit, directory, tmp, name, record)


def _make_empty_folder(path):
    """``path`` as a new empty folder (whatever was there removed)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _commit(directory, tmp, name, record):
    """Rename the filled state folder, point ``checkpoint.json`` at it, then remove older states."""
    replace_folder(tmp, directory / name)  # over one renamed but never committed by a killed run
    atomic_write_json(directory / CHECKPOINT_FILE, record)
    for old in [*directory.glob("state*"), *directory.glob(".state*")]:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)


def read_checkpoint(accelerator, directory, targets, log):
    """The :class:`TrainingProgress` of the checkpoint committed in ``directory``, its state loaded
    into ``targets`` (``{file name: object with load_state_dict}``; one whose file the checkpoint
    lacks, such as the gradient scaler of a run that had none, stays as it is) and its random
    states made this process's; ``None`` when there is none to resume.

    A checkpoint of another number of processes (:func:`check_process_count`) or of another model
    is refused in one line; one of an earlier version is removed, saying so (``log``).
    """
    directory = Path(directory)
    record = _committed_record(accelerator, directory, log)
    if record is None:
        return None
    folder = directory / record["state"]
    for file, target in targets.items():
        if (folder / file).is_file():
            _load_into(target, folder / file, directory)
    restore_random_states(torch.load(folder / random_states_file(accelerator.process_index), weights_only=False))
    return TrainingProgress(**{key: record[key] for key in ("step", "epoch", "seconds", "history", "extra")})


def _committed_record(accelerator, directory, log):
    """``checkpoint.json`` of ``directory`` when it names a state folder of this format, else ``None``
    (an earlier version's checkpoint removed, with a line in ``log``)."""
    path = directory / CHECKPOINT_FILE
    if not path.is_file():
        on_main_process(_remove_earlier_format, directory, log)
        return None
    record = json.loads(path.read_text())
    if record.get("format") != CHECKPOINT_FORMAT or not (directory / str(record.get("state"))).is_dir():
        log(f"not resuming: the checkpoint in {directory} is of another format (or lacks its state); starting afresh")
        return None
    check_process_count(record.get("num_processes"), accelerator, directory)
    return record


def _load_into(target, path, directory):
    """``target.load_state_dict`` of the file at ``path``; a state that does not fit is refused in one line."""
    try:
        target.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    except (RuntimeError, ValueError, KeyError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise LinearizeError(f"the checkpoint in {directory} does not fit this run ({path.name}: {reason}); start "
                             "afresh (--no-resume; for `linearize run`, --overwrite)") from None


def _remove_earlier_format(directory, log):
    """Remove the checkpoint an earlier version left in ``directory`` (if any), saying so."""
    earlier = [directory / name for name in EARLIER_FORMAT_FILES if (directory / name).is_file()]
    if not earlier:
        return
    _remove([*earlier, *directory.glob("state*"), *directory.glob(".state*")])
    log(f"not resuming: the checkpoint in {directory} is of an earlier linearize version, which this one does not "
        "read; removed it, starting afresh")


def clear_checkpoint(accelerator, directory, log, also=()):
    """Delete the checkpoint in ``directory`` (``resume=False``): ``checkpoint.json``, its state
    folders, ``metrics.jsonl``, an earlier version's checkpoint and the stage's own files ``also``
    (names in ``directory``); on the main process, the others wait."""
    on_main_process(_clear, Path(directory), also, log)


def _clear(directory, also, log):
    """:func:`clear_checkpoint` on the main process."""
    names = [CHECKPOINT_FILE, "metrics.jsonl", *EARLIER_FORMAT_FILES, *also]
    existing = [directory / name for name in names if (directory / name).exists()]
    existing += [*directory.glob("state*"), *directory.glob(".state*")]
    _remove(existing)
    if existing:
        log(f"not resuming: removed the earlier checkpoint in {directory}")


def _remove(paths):
    """Delete the files and folders ``paths``."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def check_process_count(saved, accelerator, where):
    """Refuse to resume a checkpoint that ``saved`` processes wrote (``None``: not recorded) in a
    run of another number of processes: their shares of every batch, hence the steps, differ."""
    if saved is not None and saved != accelerator.num_processes:
        raise LinearizeError(f"the checkpoint in {where} was written by {saved} process(es) and this run has "
                             f"{accelerator.num_processes}: resume it with {saved} (torchrun --nproc_per_node "
                             f"{saved}), or start afresh (--no-resume; for `linearize run`, --overwrite)")
