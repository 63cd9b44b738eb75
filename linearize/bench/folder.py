"""A converted model folder's crossover against softmax, the one a user sees
(``linearize bench folder DIR``).

``bench_folder(directory, ...)``: the folder's model against its own softmax original (the same
weights with ``linearize.revert``) at 128, 512 and 2,048 tokens (lengths past the model's positions
are skipped with the reason), timed and profiled with :mod:`linearize.bench.timing`; the result,
with the machine it was measured on, is written atomically to ``DIR/bench.json``, which
``linearize info DIR`` and the model card (``linearize push``) state.
"""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path

from ..config import MeasureConfig
from ..convert.loading import FOLDER_BENCH_JSON
from ..errors import LinearizeError
from ..outputs import atomic_write_json, check_writable_inside
from .crossover import CROSSOVER_RULE, crossover_text, crossovers
from .models import accepted_length, default_softmax_max_bytes, measure_lengths
from .timing import loop_settings, measuring

DEFAULT_FOLDER_SEQ_LENS = (128, 512, 2048)
#: the ``kind`` of that file (kept as first written, so earlier measurements still read)
FOLDER_BENCH_KIND = "linearize bench --model"


def is_converted_folder(path):
    """True when ``path`` is a folder holding a linearize-converted model (config.json with its block)."""
    from ..convert import read_conversion_record

    if path is None or not (Path(path) / "config.json").is_file():
        return False
    try:
        read_conversion_record(path)
    except LinearizeError:
        return False
    return True


def _measured_lengths(seq_lens, limit):
    """``(wanted, measured, skipped)``: the lengths asked for (sorted), those the model's ``limit``
    of positions takes, and ``{length: why not}`` for the others."""
    wanted = sorted({int(n) for n in seq_lens})
    if not wanted or wanted[0] < 1:
        raise LinearizeError(f"lengths must be positive; got {wanted}")
    measured = [n for n in wanted if limit is None or n <= int(limit)]
    skipped = {str(n): f"longer than the model's {limit} positions (convert with --max-length N to go further)"
               for n in wanted if n not in measured}
    if not measured:
        raise LinearizeError(f"every length {wanted} is longer than the model's {limit} positions; pass "
                             f"--seq-lens with lengths ≤ {limit}")
    return wanted, measured, skipped


def bench_folder(directory, seq_lens=DEFAULT_FOLDER_SEQ_LENS, *, measure: MeasureConfig | None = None,
                 softmax_max_bytes=None, seed=0, log=print):
    """A converted model folder against its softmax original (same weights, ``linearize.revert``);
    the result is written atomically to ``directory/bench.json`` and returned.

    ``measure``: how to measure (:class:`linearize.config.MeasureConfig`; None: its defaults, 5
    repeats after 2 warm-up rounds). Lengths past the model's positions are skipped with the reason
    (``skipped_lengths``). The record holds the rows (as :func:`linearize.bench.measure_lengths`),
    the ``crossover`` (:func:`linearize.bench.crossover_point`), the ``machine`` it was measured on
    and when, and the ``state`` the models were timed in. ``measure.processes`` > 0: the folder
    itself and its softmax original (saved to a temporary folder as plain transformers) are timed
    in that many fresh processes of plain transformers, the state a user is in
    (:mod:`linearize.bench.user_state`), compiled with ``torch.compile(mode=measure.compile_mode)``
    where given; 0: in this process, with the models in memory.
    """
    from ..convert import load, revert, summary
    from .long import user_state_measure, user_state_note, user_state_placement

    directory = Path(directory)
    about = summary(directory)  # a one-line error for a folder that is not a converted model
    check_writable_inside(directory, FOLDER_BENCH_JSON)  # nor one its result cannot be written into
    if about["base_model_type"] == "timm" or "image_size" in json.loads((directory / "config.json").read_text()):
        raise LinearizeError(f"{directory} is a vision model; `linearize bench folder DIR` measures text models "
                             "(token inputs)")
    measure = MeasureConfig() if measure is None else measure
    placement = user_state_placement(measure)  # the settings' errors before the model loads
    processes, compile_mode = measure.processes, measure.compile_mode
    model = load(directory).eval()
    softmax = revert(copy.deepcopy(model)).eval()
    softmax_label = f"softmax ({getattr(softmax.config, '_attn_implementation', None) or 'default'})"
    limit = accepted_length(model)
    wanted, measured, skipped = _measured_lengths(seq_lens, limit)
    if skipped and log:
        log(f"skipped N = {', '.join(skipped)}: longer than the model's {limit} positions")
    softmax_max_bytes = default_softmax_max_bytes(placement) if softmax_max_bytes is None else int(softmax_max_bytes)
    method = about["method"]
    timed = dict(softmax_max_bytes=softmax_max_bytes, seed=seed, log=log, placement=placement)
    with measuring(measure.threads) as machine:
        if processes:  # the folder as saved, beside its softmax original saved as plain transformers
            rows = user_state_measure({softmax_label: softmax, method: directory}, softmax_label, measured,
                                      capped=[softmax_label], measure=measure, **timed)
        else:
            rows = measure_lengths({softmax_label: softmax, method: model}, softmax_label, measured,
                                   **loop_settings(measure), **timed)
    record = {"kind": FOLDER_BENCH_KIND, "version": 1, "method": method, "options": about["options"],
              "reference": softmax_label, "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                  timespec="seconds"), "machine": machine,
              "config": {"seq_lens": wanted, "batch_size": measure.batch_size, **placement.record(),
                         "repeats": measure.repeats, "warmup": measure.warmup,
                         "memory": measure.memory, "seed": seed,
                         "crossover_rule": CROSSOVER_RULE, "processes": processes, "compile_mode": compile_mode,
                         "state": user_state_note(measure, placement)},
              "rows": rows, "skipped_lengths": skipped,
              "crossover": crossovers(rows, [method], softmax_label).get(method)}
    atomic_write_json(directory / FOLDER_BENCH_JSON, record)
    if log:
        log(f"{method}: {crossover_text(record['crossover'])}; written to {directory / FOLDER_BENCH_JSON}")
        if machine.get("busy_warning"):
            log("warning: " + machine["busy_warning"])
    return record


def read_folder_bench(directory):
    """The ``bench.json`` :func:`bench_folder` wrote into a model folder, or None."""
    path = Path(directory) / FOLDER_BENCH_JSON
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") == FOLDER_BENCH_KIND else None


def machine_text(machine):
    """``"AMD EPYC … (2 usable cores, 2 torch threads, torch 2.x)"``."""
    return (f"{machine.get('cpu_model')} ({machine.get('usable_cores')} usable cores, "
            f"{machine.get('torch_threads')} torch threads, torch {machine.get('torch')})")


def folder_speed_lines(record):
    """``{"crossover", "time ÷ softmax", "measured on"}``: what ``linearize info`` and the card state (a busy
    machine's warning, when the record has one, in "measured on")."""
    method, reference = record["method"], record["reference"]
    ratios = ", ".join(f"{row['results'][method]['time_vs_softmax']:.2f} at N = {row['seq_len']:,}"
                       for row in record["rows"] if "time_vs_softmax" in row["results"].get(method, {}))
    skipped = [int(n) for n in record.get("skipped_lengths") or {}]
    if skipped:
        ratios += f"; not measured at N = {', '.join(f'{n:,}' for n in skipped)} (past the model's positions)"
    date = str(record.get("measured_at", ""))[:10]
    processes = record["config"].get("processes") or 0  # records before --processes: timed in linearize's process
    state = (f"medians of {processes} fresh processes of plain transformers (a user's state)" if processes else
             "in the linearize process (`linearize bench folder DIR --processes 5`: in a user's)")
    busy = (record.get("machine") or {}).get("busy_warning")  # the timings' own caveat travels with them
    return {"crossover": crossover_text(record.get("crossover"), unit=reference),
            "time ÷ softmax": ratios or "—",
            "measured on": f"{machine_text(record.get('machine') or {})}, batch {record['config']['batch_size']}, "
                           f"{state}, {date}" + (f"; warning: {busy}" if busy else "")}
