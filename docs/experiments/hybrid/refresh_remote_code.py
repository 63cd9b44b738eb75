"""A copy of a saved folder whose ``modeling_linearize.py`` carries this checkout's bundled attention code
(``hf_remote_code.bundled_sources``) in place of the code it was saved with: the same weights and config, so
two checkouts' inference paths can be timed on one trained model in a user's process (run it from each checkout,
or from a ``git worktree`` of the earlier commit).

    PYTHONPATH=. python docs/experiments/hybrid/refresh_remote_code.py <saved folder> <copy>
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from linearize.convert.backends.hf_remote_code import bundled_sources

FIRST, MODEL_CLASSES = "# ---- linearize.errors", "# ---- the model classes"


def refresh(source, target):
    source, target = Path(source), Path(target)
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    path = target / "modeling_linearize.py"
    text = path.read_text()
    path.write_text(text[:text.index(FIRST)] + bundled_sources() + "\n\n" + text[text.index(MODEL_CLASSES):])
    return path


if __name__ == "__main__":
    print("rewrote", refresh(*sys.argv[1:3]))
