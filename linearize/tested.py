"""The versions linearize was tested with, and how the installed ones compare (``linearize info --env``).

``constraints.txt`` at the repository's root pins every package the tests ran with, and
``scripts/setup.sh`` (so CI) installs with it; it is not part of the installed package, so the main
versions are repeated here (tests/test_cli_speed_and_setup.py checks that the two agree). The
library's own dependency ranges (``pyproject.toml``) stay open: another release may work, but only
these were tested. Reads installed metadata only: imports none of these packages.
"""

from __future__ import annotations

from importlib import metadata

#: package -> the version the tests passed with (torch and torchvision: scripts/setup.sh's x86-64 pins;
#: the others: constraints.txt)
TESTED = {
    "torch": "2.14.1",
    "torchvision": "0.29.1",
    "transformers": "5.24.0",
    "accelerate": "1.15.0",
    "datasets": "5.2.0",
    "safetensors": "0.8.0",
    "huggingface-hub": "2.4.0",
    "timm": "1.0.31",
    "typer": "0.29.2",
    "rich": "15.0.0",
    "scikit-learn": "1.9.1",
    "scipy": "1.17.1",
    "matplotlib": "3.11.2",
    "pyyaml": "6.0.4",
    "filelock": "4.3.1",
    "onnx": "1.23.2",
    "onnxscript": "0.7.2",
    "onnxruntime": "1.32.0",
    "sentence-transformers": "6.2.0",
}

#: what linearize uses of transformers beyond its public API, so that its release matters most
TRANSFORMERS_INTERNALS = "its attention and mask interfaces and its checkpoint conversion mapping"


def installed_version(package):
    """The installed version of ``package``, or None when it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def is_tested_release(installed, tested):
    """``installed`` is the ``tested`` release; a local build tag (``2.14.1+cpu``) does not count."""
    return installed is not None and installed.split("+")[0] == tested


def version_rows():
    """``[(package, installed version or None, tested version, whether installed is the tested one)]``."""
    rows = []
    for package, tested in TESTED.items():
        installed = installed_version(package)
        rows.append((package, installed, tested, is_tested_release(installed, tested)))
    return rows


def untested_warnings(rows=None):
    """One line per installed package whose version differs from the tested one (packages not
    installed, an optional extra, are not warned about); transformers' first, saying why it matters."""
    rows = version_rows() if rows is None else rows
    differing = [(package, installed, tested) for package, installed, tested, same in rows
                 if installed is not None and not same]
    lines = []
    for package, installed, tested in sorted(differing, key=lambda row: row[0] != "transformers"):
        why = (f": linearize relies on {TRANSFORMERS_INTERNALS}, which change between releases"
               if package == "transformers" else "")
        lines.append(f"{package} {installed} is installed, but linearize was tested with {tested}{why}; "
                     f"`pip install {package}=={tested}` installs the tested one (in a clone, bash scripts/setup.sh "
                     "installs every tested version)")
    return lines
