"""Atomic file and folder writes: a crash never leaves a half-written output behind.

Every file is written through :func:`atomic_path` (a temporary file beside it, flushed to disk
and renamed over it); a folder through :func:`atomic_dir` (a temporary sibling folder renamed
over it, :func:`replace_folder`)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


def is_disk_full(error):
    """``error`` says the disk (or the user's quota) is full: an ``OSError`` ENOSPC / EDQUOT, or
    safetensors' own error wrapping one."""
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(error)
    return type(error).__name__ == "SafetensorError" and ("No space left" in text or "StorageFull" in text)


def disk_full_error(path):
    """The one-line error of a write to ``path`` that failed for want of disk space."""
    from .errors import LinearizeError

    return LinearizeError(f"no space left on the disk while writing {path} (the partial output was removed); "
                          "free some space or write to another disk, then run again")


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path`` to write to; on success it is flushed to disk
    (``fsync``) and renamed over ``path`` (``os.replace``), so ``path`` is the old file or the
    new one, never half of it. On any failure the temporary file is removed (a full disk becomes
    a one-line error). Every file :mod:`linearize` writes atomically goes through here."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
        yield tmp
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if is_disk_full(error):
            raise disk_full_error(path) from None
        raise


def _fsync(path):
    """Flush the file at ``path`` (written and closed) to the disk."""
    fd = os.open(path, os.O_RDWR if os.name == "nt" else os.O_RDONLY)  # Windows flushes only a writable handle
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path, data):
    """Write ``data`` to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(data)


def atomic_write_text(path, text):
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


def atomic_write_json(path, data):
    """Write ``data`` as indented JSON to ``path`` atomically (:func:`atomic_path`)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def check_output_path(path):
    """``path`` (``~`` expanded) if a folder can be made there: refuse a file in the way, or a
    file where one of its parent folders should be, in one line that says what to do."""
    from .errors import LinearizeError

    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise LinearizeError(f"output path {path} exists and is not a folder; choose another --out")
    blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise LinearizeError(f"cannot make the output folder {path}: {blocking} is a file, not a folder; "
                             "choose another --out")
    return path


def prepare_output_dir(path, overwrite=False):
    """Refuse an existing non-empty folder unless ``overwrite`` (say how to proceed), a path a
    folder cannot be made at, and the current folder (an output folder is written beside its
    destination and renamed into place, which cannot replace the folder one is in)."""
    from .errors import LinearizeError

    path = check_output_path(path)
    if path.resolve() in (Path.cwd(), *Path.cwd().parents):
        raise LinearizeError(f"--out {path} is the folder you are in (or holds it): the output is written whole "
                             "and renamed into place, which cannot replace it; name a new folder, e.g. --out model")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise LinearizeError(f"output folder {path} exists and is not empty; pass --overwrite to replace it")
    return path


@contextmanager
def atomic_dir(path):
    """Yield a temporary sibling folder; on success it replaces ``path`` as a whole
    (:func:`replace_folder`). On any failure the temporary folder is removed (a full disk becomes
    a one-line error)."""
    path = Path(path).expanduser().resolve()  # ".", "a/.." have no name to put a sibling beside
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
        yield tmp
        replace_folder(tmp, path)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(error):
            raise disk_full_error(path) from None
        raise


def replace_folder(source, target):
    """Rename the complete folder ``source`` to ``target`` in one step: a folder already at
    ``target`` is moved aside first, put back if the rename fails, and removed once ``source``
    is in place."""
    target = Path(target)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    try:
        os.replace(source, target)
    except BaseException:
        if old is not None and not target.exists():
            os.replace(old, target)  # the swap failed half way: the previous folder comes back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
