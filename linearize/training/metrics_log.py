"""``metrics.jsonl``: one JSON line per logged step, the full log of a training run."""

from __future__ import annotations

import json

from ..outputs import atomic_write_text


def append_jsonl(path, entry):
    """Append ``entry`` as one line to ``path`` (nothing when ``path`` is ``None``: not the main process)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")


def truncate_jsonl(path, step):
    """Keep only the ``metrics.jsonl`` lines of steps ``<= step`` (a resumed run logs the rest again)."""
    if path is None or not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= step]
    if len(kept) != len(lines):
        atomic_write_text(path, "".join(line + "\n" for line in kept))
