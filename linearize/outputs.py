"""Atomic file and folder writes: a crash never leaves a half-written output behind.

Every file is written through :func:`atomic_path` (a temporary file beside it, flushed to disk
and renamed over it); a folder through :func:`atomic_dir` (a temporary sibling folder renamed
over it, :func:`replace_folder`). Their temporary names are ``.<name>.XXXXXXXX.partial``.

A command checks its outputs before any work (:func:`check_output_path`, :func:`check_output_file`:
a path it cannot write is one line) and holds its output folder's lock while it writes it
(:func:`writing_output`, :func:`locked_output`: a second writer is refused in one line naming the
holder; the leftovers of a killed one are removed); so does each library function that writes an
output folder (:func:`writes_output`), called from Python or by a command. A write that fails for
want of space or permission is one line naming the path and the cause (:func:`write_error`), the
previous output left as it was.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from .launcher import launched_processes

#: the suffix of every temporary file and folder the writers here make (stale ones are recognised by it)
TEMPORARY_SUFFIX = ".partial"
#: ``.<name>.XXXXXXXX.partial`` (mkstemp / mkdtemp's 8 random characters) and ``.<name>.old-<pid>.partial``
TEMPORARY_NAME = re.compile(r"^\.(?P<name>.+)\.(?:[a-z0-9_]{8}|old-(?P<pid>\d+))" + re.escape(TEMPORARY_SUFFIX) + "$")
#: the suffix of the file a write check makes and removes at once (:func:`_refusal`). Not
#: :data:`TEMPORARY_SUFFIX`: a check runs before its process holds the output's lock, and the holder
#: clearing stale temporaries took a checker's probe for one (and failed when the checker removed it first)
PROBE_SUFFIX = ".probe"
#: errors that say the disk (the user's quota, the process's file size limit) is full
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
#: what each write error means, said the user's way
WRITE_CAUSES = {
    errno.ENOSPC: "no space left on the disk",
    errno.EDQUOT: "the disk quota was exceeded",
    errno.EFBIG: "the file size limit (ulimit -f) was reached",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "the file system is read-only",
}


def write_errno(error, written=()):
    """The errno of the failed write ``error`` when it is the disk's or the permissions' fault:
    an ``OSError``'s own, the ``os error N`` safetensors' error names, or (an error that names no
    cause, as ``torch.save``'s) diagnosed: ENOSPC when the disk of a ``written`` path is full,
    EFBIG when a ``written`` file reached the process's file size limit. None otherwise."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno
    found = re.search(r"os error (\d+)", str(error))
    if type(error).__name__ == "SafetensorError" and found:
        return int(found.group(1))
    if not isinstance(error, RuntimeError):
        return None
    return next(filter(None, (_full_disk_errno(Path(path)) for path in written)), None)


def _full_disk_errno(path):
    """ENOSPC if the disk of ``path`` has (almost) no space left, EFBIG if the file ``path`` (or
    one in the folder ``path``) is as large as the process's file size limit allows, else None."""
    import resource

    try:
        disk = os.statvfs(path if path.is_dir() else path.parent)
    except OSError:
        return None
    if disk.f_bavail * disk.f_frsize < 2**20:
        return errno.ENOSPC
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else []
    return errno.EFBIG if any(file.stat().st_size >= limit for file in files) else None


def is_disk_full(error, written=()):
    """``error`` says the disk (the user's quota, the file size limit) is full (:func:`write_errno`)."""
    return write_errno(error, written) in DISK_FULL


def write_error(path, code, atomic=True):
    """The one-line error of a write to ``path`` that failed with ``code`` (an errno): the cause,
    that nothing was half-written (``atomic``: it was written through :func:`atomic_path` or
    :func:`atomic_dir`), and what to do."""
    from .errors import LinearizeError

    cause = WRITE_CAUSES.get(code) or os.strerror(code).lower()
    if code in DISK_FULL:
        advice = ("raise the limit (ulimit -f unlimited)" if code == errno.EFBIG else
                  "free some space or write to another disk")
        removed = " (the partial output was removed, nothing was half-written)" if atomic else ""
        return LinearizeError(f"{cause} while writing {path}{removed}; {advice}, then run the command again")
    return LinearizeError(f"cannot write {path}: {cause}; choose a folder you can write to")


def disk_full_error(path, code=errno.ENOSPC):
    """The one-line error of a write to ``path`` that failed for want of disk space (:func:`write_error`)."""
    return write_error(path, code)


def _translated(error, path, temporary):
    """The one-line error of ``error`` raised while ``path`` was written through ``temporary``, or
    None when it is not a full disk nor a write the permissions refused to ``path``, its temporary
    or what is in it (a bug keeps its traceback)."""
    code = write_errno(error, [temporary])
    if code in DISK_FULL:
        return write_error(path, code)
    names = [os.fsdecode(name) for name in (getattr(error, "filename", None), getattr(error, "filename2", None))
             if name is not None]
    ours = any(_is_within(name, temporary) or _is_beside(name, path) for name in names)
    if code in WRITE_CAUSES and ours:
        return write_error(path, code)
    return None


def _is_within(name, folder):
    name, folder = os.path.abspath(name), os.path.abspath(folder)
    return name == folder or name.startswith(folder.rstrip(os.sep) + os.sep)


def _is_beside(name, path):
    """``name`` is ``path`` or one of the names put beside it while it is replaced (``.<name>.*``)."""
    name, path = Path(os.path.abspath(name)), Path(os.path.abspath(path))
    return name == path or (name.parent == path.parent and name.name.startswith(f".{path.name}."))


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(path):
    """Give the file ``path`` (or every file and folder in the folder ``path``) the permissions a
    newly made one has under the umask: ``mkstemp``, ``mkdtemp`` and safetensors make theirs
    private (0600 / 0700), which would leave ``model.safetensors`` unreadable to the group."""
    path, mask = Path(path), _umask()
    for entry in [path, *(path.rglob("*") if path.is_dir() else ())]:
        if entry.is_symlink():
            continue
        executable = entry.is_dir() or entry.stat().st_mode & 0o111
        os.chmod(entry, (0o777 if executable else 0o666) & ~mask)


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path`` to write to; on success it is flushed to disk
    (``fsync``), given the umask's permissions and renamed over ``path`` (``os.replace``), so
    ``path`` is the old file or the new one, never half of it. On any failure the temporary file
    is removed; a full disk or a refused write is one line (:func:`write_error`). Every file
    :mod:`linearize` writes atomically goes through here."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX, dir=path.parent)
    except OSError as error:
        raise write_error(path, error.errno) from None
    os.close(fd)
    try:
        yield tmp
        _fsync(tmp)
        follow_umask(tmp)
        os.replace(tmp, path)
    except BaseException as error:
        translated = _translated(error, path, tmp)  # before the removal: a full file says why
        Path(tmp).unlink(missing_ok=True)
        if translated is not None:
            raise translated from None
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


def check_output_path(path, option="--out"):
    """``path`` (``~`` expanded) if a folder can be made and written there: refuse a file in the
    way, a file where one of its parent folders should be, or a place this process may not write
    to (:func:`check_writable`), in one line that says what to do."""
    from .errors import LinearizeError

    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise LinearizeError(f"output path {path} exists and is not a folder; choose another {option}")
    blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise LinearizeError(f"cannot make the output folder {path}: {blocking} is a file, not a folder; "
                             f"choose another {option}")
    return check_writable(path, option)


def check_output_file(path, option="--out"):
    """``path`` (``~`` expanded) if the file can be written there (:func:`check_writable`); a
    folder in the way, or a place this process may not write to, is one line naming ``option``."""
    from .errors import LinearizeError

    path = Path(path).expanduser()
    if path.is_dir():
        raise LinearizeError(f"{option} {path} is a folder; give a file name, e.g. {option} {path / 'out.json'}")
    blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise LinearizeError(f"cannot write {path}: {blocking} is a file, not a folder; choose another {option}")
    return check_writable(path, option)


def check_writable(path, option="--out"):
    """``path`` if this process can write it: a file is made and removed (as the atomic writers
    do) in the nearest existing folder above it, and in ``path`` itself when it is a folder (a run
    folder is written in place). Trying is the one test that holds for root, read-only mounts and
    ``/proc`` alike (``os.access`` answers yes to root). Refused: one line naming ``option``."""
    from .errors import LinearizeError

    path = Path(path).expanduser()
    refused = write_refusal(path)
    if refused:
        place, cause = refused
        raise LinearizeError(f"cannot write {option} {path}: {place} does not accept new files ({cause}); "
                             f"choose a folder you can write to")
    return path


def write_refusal(path):
    """``(folder, why)`` when this process cannot write ``path`` (:func:`check_writable`'s test: a file made and
    removed in the nearest existing folder above it, and in ``path`` itself when it is a folder), else None."""
    path = Path(path).expanduser()
    places = [parent for parent in path.absolute().parents if parent.exists()][:1]
    if path.is_dir():
        places.append(path)
    for place in places:
        cause = _refusal(place, path.name)
        if cause:
            return place, cause
    return None


def check_writable_inside(folder, name):
    """``folder`` (``~`` expanded), an existing folder a command adds the file ``name`` to (as
    ``linearize bench folder DIR`` its ``bench.json``), if this process can make a file in it
    (:func:`check_writable`'s test); refused: one line saying what to do."""
    from .errors import LinearizeError

    folder = Path(folder).expanduser()
    cause = _refusal(folder, name)
    if cause:
        raise LinearizeError(f"cannot write {folder / name}: {folder} does not accept new files ({cause}); make it "
                             "writable, or work on a copy of the folder")
    return folder


def _refusal(place, name):
    """Why the existing folder ``place`` refuses a new file, in the user's words, or None: a file
    named after ``name`` (``.<name>.XXXXXXXX.probe``: not a stale temporary to a lock's holder,
    :data:`PROBE_SUFFIX`) is made there and removed."""
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{name}.", suffix=PROBE_SUFFIX, dir=place)
    except OSError as error:
        return WRITE_CAUSES.get(error.errno) or (error.strerror or str(error)).lower()
    os.close(fd)
    Path(probe).unlink(missing_ok=True)  # a writer replacing ``place`` (a folder) may have moved it away
    return None


def prepare_output_dir(path, overwrite=False, how="--overwrite", inputs=()):
    """Refuse an existing non-empty folder unless ``overwrite`` (say how to proceed: ``how``, the flag or
    argument that replaces it), a path a folder cannot be made or written at, the current folder (an
    output folder is written beside its destination and renamed into place, which cannot replace the
    folder one is in), and a folder that is, holds or lies inside one of ``inputs`` (the folders the
    command reads, None for one not given: ``--overwrite`` would replace its own source)."""
    from .errors import LinearizeError

    path = check_output_path(path)
    if path.resolve() in (Path.cwd(), *Path.cwd().parents):
        raise LinearizeError(f"--out {path} is the folder you are in (or holds it): the output is written whole "
                             "and renamed into place, which cannot replace it; name a new folder, e.g. --out model")
    resolved = path.resolve()
    for source in (Path(given).expanduser() for given in inputs if given is not None):
        if source.is_dir() and (resolved == source.resolve() or source.resolve() in resolved.parents
                                or resolved in source.resolve().parents):
            raise LinearizeError(f"--out {path} is, holds or lies inside {source}, which this command reads: writing "
                                 "it would replace its own input; choose an --out beside it")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise LinearizeError(f"output folder {path} exists and is not empty; pass {how} to replace it")
    return path


@contextmanager
def atomic_dir(path):
    """Yield a temporary sibling folder; on success its files get the umask's permissions and it
    replaces ``path`` as a whole (:func:`replace_folder`). On any failure the temporary folder is
    removed and ``path`` left as it was; a full disk or a refused write is one line
    (:func:`write_error`)."""
    path = Path(path).expanduser().resolve()  # ".", "a/.." have no name to put a sibling beside
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX, dir=path.parent))
    except OSError as error:
        raise write_error(path, error.errno) from None
    try:
        yield tmp
        follow_umask(tmp)
        replace_folder(tmp, path)
    except BaseException as error:
        translated = _translated(error, path, tmp)  # before the removal: a full file says why
        shutil.rmtree(tmp, ignore_errors=True)
        if translated is not None:
            raise translated from None
        raise


def replace_folder(source, target):
    """Rename the complete folder ``source`` to ``target`` in one step: a folder already at
    ``target`` is moved aside first, put back if the rename fails, and removed once ``source``
    is in place."""
    target = Path(target)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}{TEMPORARY_SUFFIX}")
        os.replace(target, old)
    try:
        os.replace(source, target)
    except BaseException:
        if old is not None and not target.exists():
            os.replace(old, target)  # the swap failed half way: the previous folder comes back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ---- one writer per output folder ----------------------------------------------------------------

def lock_file_of(path):
    """The lock file of the output ``path``: ``.<name>.lock`` beside it (not inside: the output
    is replaced whole). Its holder is written beside it, in ``.<name>.lock.holder``."""
    path = Path(path).expanduser().resolve()
    return path.with_name(f".{path.name}.lock")


def lock_holder(command=None):
    """Who holds a lock, as a second writer is told: pid, host, start time and command."""
    import socket
    import sys
    import time

    command = command or " ".join(["linearize", *sys.argv[1:]])
    return f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}: {command}"


@contextmanager
def locked_output(path, *, option="--out", command=None, lock=True):
    """Check the output folder ``path`` (:func:`check_output_path`) and hold its lock
    (:func:`lock_file_of`, a ``filelock`` OS lock) while a command writes it; yields the checked
    path. A second writer is refused in one line naming the holder (``command``: what the holder
    runs; default this process's command line). The OS releases the lock of a killed process:
    the next writer takes it over and removes what the killed one left half-written
    (:func:`remove_stale_temporaries`). The lock files go when the lock is released, and so does the
    folder itself when it did not exist before and the writer failed leaving it empty. ``lock``:
    False in a launcher's other processes (the main one writes and holds it)."""
    import filelock

    from .errors import LinearizeError

    path = check_output_path(path, option)
    if not lock:
        yield path
        return
    lock_path = lock_file_of(path)
    holder_path = lock_path.with_name(lock_path.name + ".holder")  # not the lock file: filelock 3 truncates it
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    file_lock = filelock.FileLock(lock_path, timeout=0)
    try:
        file_lock.acquire()
    except filelock.Timeout:
        held_by = _holder_written_in(holder_path)
        who = "another writer in this process" if held_by.startswith(f"pid {os.getpid()} ") else \
            "another linearize process"
        raise LinearizeError(f"{path} is being written by {who} ({held_by or 'holder unknown'}); "
                             f"wait until it ends, or choose another {option}") from None
    absent = not path.exists()
    try:
        holder_path.write_text(lock_holder(command) + "\n", encoding="utf-8")
        remove_stale_temporaries(path)
        yield path
    except BaseException:
        if absent:  # a command refused before it wrote anything leaves no empty folder behind
            with contextlib.suppress(OSError):  # not empty, or not a folder: kept
                path.rmdir()
        raise
    finally:
        holder_path.unlink(missing_ok=True)
        lock_path.unlink(missing_ok=True)  # while still held: the next writer locks a new file
        file_lock.release()


def _holder_written_in(holder_path):
    """Who holds a lock, as its holder wrote it in ``holder_path``; "" while it has not written it yet
    or has just released the lock (the file goes with the lock)."""
    try:
        return holder_path.read_text(encoding="utf-8", errors="replace").strip()
    except FileNotFoundError:
        return ""


#: the output folders (their lock files) this thread writes through :func:`writing_output`
_WRITING = threading.local()


def _writes_outputs():
    """This process writes the outputs: always without a launcher, else only its main process."""
    if launched_processes() == 1:  # read from the environment: no torch loaded for it
        return True
    from .training.accelerator import is_main_process

    return is_main_process()


@contextmanager
def writing_output(path, option="--out", command=None):
    """A writer's hold on its output folder ``path``, taken before any work: checked (a place it
    cannot write is one line) and locked while it is written, so a second writer is refused in one
    line naming the holder (:func:`locked_output`; ``command``: the holder's). Under a launcher the
    main process, which writes the outputs, holds the lock. A call in a thread that holds ``path``
    through here already goes on under that hold: a command takes it before torch loads, then calls
    the library function that takes it too (:func:`writes_output`). Yields the checked path."""
    held = getattr(_WRITING, "locks", frozenset())
    lock_path = lock_file_of(path)
    if lock_path in held:
        yield Path(path).expanduser()
        return
    with locked_output(path, option=option, command=command, lock=_writes_outputs()) as checked:
        _WRITING.locks = held | {lock_path}
        try:
            yield checked
        finally:
            _WRITING.locks = held


def writes_output(parameter):
    """Decorator of a library function that writes the output folder its argument ``parameter``
    names: each call holds that folder (:func:`writing_output`) while it runs, so a second writer,
    called from Python or run from the command line, is refused in one line naming this call. A
    call without the folder (None) is left to the function."""
    def decorate(function):
        signature = inspect.signature(function)

        @functools.wraps(function)
        def writer(*args, **kwargs):
            path = signature.bind_partial(*args, **kwargs).arguments.get(parameter)
            if path is None:
                return function(*args, **kwargs)
            caller = " ".join(sys.argv) or "python"
            with writing_output(path, command=f"{function.__name__}() called by {caller}"):
                return function(*args, **kwargs)

        return writer

    return decorate


def remove_stale_temporaries(path):
    """Remove what a writer of ``path`` killed mid-write left (call it holding ``path``'s lock: no
    live writer owns them): the temporary files and folders (``.<name>.XXXXXXXX.partial``) beside
    ``path`` and, two levels deep, inside ``path`` and its ``<path>.work`` (a run folder, a
    stage's checkpoints: written in place). A previous output moved aside
    (``.<name>.old-<pid>.partial``) goes back where its output is missing. Returns the paths removed."""
    path = Path(path).expanduser().resolve()
    found = [entry for entry in _temporaries(path.parent, depth=1)
             if TEMPORARY_NAME.match(entry.name)["name"] == path.name]  # not another output's beside it
    for folder in (path, path.with_name(path.name + ".work")):
        found += _temporaries(folder, depth=2)
    removed = []
    for entry in found:
        pid = TEMPORARY_NAME.match(entry.name)["pid"]
        original = entry.with_name(TEMPORARY_NAME.match(entry.name)["name"])
        try:
            if pid is not None and not original.exists():
                os.replace(entry, original)  # killed between moving the old output aside and renaming the new one in
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except FileNotFoundError:  # gone since it was listed: nothing is left to remove
            continue
        removed.append(entry)
    return removed


def _temporaries(folder, depth):
    """The temporary entries (:data:`TEMPORARY_NAME`) in ``folder`` and its visible subfolders,
    ``depth`` levels deep."""
    if depth < 1 or not folder.is_dir() or folder.is_symlink():
        return []
    found = []
    for entry in folder.iterdir():
        if TEMPORARY_NAME.match(entry.name):
            found.append(entry)
        elif not entry.name.startswith("."):
            found += _temporaries(entry, depth - 1)
    return found
