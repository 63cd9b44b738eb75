"""Write constraints.txt from this checkout's .venv: the installed version of every package that
``pip install -e '.[test]'`` pulls in, which scripts/setup.sh (and so CI) installs with ``-c``.

Run it after upgrading .venv to the versions the tests passed with, then update
linearize/tested.py to match (tests/test_cli_speed_and_setup.py checks both):

    .venv/bin/python scripts/freeze-constraints.py > constraints.txt

Left out: linearize itself, and torch and torchvision with their platform-specific packages
(CUDA, triton): setup.sh pins torch and torchvision per platform, and torch pins the rest.
"""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = ("linearize", ("test",))
LEFT_OUT = {"linearize", "torch", "torchvision"}
LEFT_OUT_PREFIXES = ("nvidia-", "triton", "cuda-")


def requirements(name, extras):
    """The requirements of the installed distribution ``name`` with ``extras`` that apply here."""
    for text in metadata.distribution(name).requires or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in (*extras, "")):
            yield requirement


def dependency_closure(name, extras):
    """``{canonical name: installed version}`` of everything ``name[extras]`` needs, itself included."""
    versions, seen, todo = {}, set(), [(name, tuple(extras))]
    while todo:
        current, current_extras = todo.pop()
        if (canonicalize_name(current), current_extras) in seen:
            continue
        seen.add((canonicalize_name(current), current_extras))
        versions[canonicalize_name(current)] = metadata.version(current)
        todo += [(requirement.name, tuple(sorted(requirement.extras))) for requirement in
                 requirements(current, current_extras)]
    return versions


def main():
    versions = dependency_closure(*ROOT)
    kept = {name: version for name, version in versions.items()
            if name not in LEFT_OUT and not name.startswith(LEFT_OUT_PREFIXES)}
    print("# The versions linearize was tested with: scripts/setup.sh installs with -c constraints.txt.")
    print("# Made by scripts/freeze-constraints.py; linearize/tested.py repeats the main ones.")
    for name in sorted(kept):
        print(f"{name}=={kept[name]}")


if __name__ == "__main__":
    main()
