"""Learning-rate schedules (transformers' warmup-then-decay schedules, by name)."""

from __future__ import annotations

from ..errors import LinearizeError

SCHEDULERS = ("cosine", "linear", "constant")


def make_scheduler(name, optimizer, warmup, total):
    """The ``name`` schedule (cosine | linear | constant) of ``optimizer``: ``warmup`` steps of
    linear warmup, then decay to 0 at step ``total`` (constant: no decay)."""
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup, \
        get_linear_schedule_with_warmup

    if name == "cosine":
        return get_cosine_schedule_with_warmup(optimizer, warmup, total)
    if name == "linear":
        return get_linear_schedule_with_warmup(optimizer, warmup, total)
    if name == "constant":
        return get_constant_schedule_with_warmup(optimizer, warmup)
    raise LinearizeError(f"unknown scheduler {name!r}; valid: {', '.join(SCHEDULERS)}")
