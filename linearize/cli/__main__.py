"""``python -m linearize.cli`` (and ``torchrun -m linearize.cli``): the ``linearize`` command."""

from . import main

main()
