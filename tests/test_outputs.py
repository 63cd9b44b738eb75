"""Atomic writes (``linearize.outputs``): every file through ``atomic_path``, folders through
``atomic_dir``; a failed write leaves the old output and no temporary file, a full disk is one line."""

import errno
import json
import os

import pytest

from linearize.errors import LinearizeError
from linearize.outputs import (atomic_dir, atomic_path, atomic_write_bytes, atomic_write_json, atomic_write_text,
                               replace_folder)


def test_the_writers_replace_the_file_whole(tmp_path):
    target = tmp_path / "sub" / "out.json"
    atomic_write_json(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    atomic_write_text(target, "ü\n")
    assert target.read_text(encoding="utf-8") == "ü\n"
    atomic_write_bytes(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask
    assert [p.name for p in target.parent.iterdir()] == ["out.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            open(tmp, "w").write("half")
            raise RuntimeError("killed")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_full_disk_is_one_line(tmp_path):
    with pytest.raises(LinearizeError, match="no space left on the disk while writing"):
        with atomic_path(tmp_path / "out.bin"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_and_replace_folder_swap_whole_folders(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with atomic_dir(target) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    source = tmp_path / "filled"
    source.mkdir()
    (source / "state").write_text("1")
    replace_folder(source, target)
    assert [p.name for p in target.iterdir()] == ["state"] and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_replace_folder_puts_the_old_folder_back_when_the_rename_fails(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(OSError):
        replace_folder(tmp_path / "missing", target)
    assert (target / "old.txt").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["model"]
