"""The version of linearize (the one place it is written in the package; ``pyproject.toml`` has it too)."""

__version__ = "0.1.0"
