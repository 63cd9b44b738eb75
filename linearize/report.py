"""The recovery report: a run's ``report.json`` rendered into ``report.md`` and ``figures/*.png``.

The pipeline writes ``report.json`` once (:func:`write_report`); ``linearize report RUN_DIR``
re-renders ``report.md`` and the figures from it (:func:`render_report`), so the text and the
pictures can improve without re-running anything. Every file is written atomically.

The headline number is LUNA's (Table 2): the student's score as a percentage of the fine-tuned
softmax teacher's, per metric and averaged. Read the attention KL first (docs/methods.md)
(on near bag-of-words tasks accuracy separates methods weakly), so the per-layer stage-1
distances sit right under the scores, with the worst-distilled layer called out.

Schema (``schema_version`` 1). Only ``schema``, ``schema_version``, ``recipe``, ``task``,
``model`` and ``scores`` are required; every other section, and any key inside a section, may
be missing or ``null`` — the renderer then leaves that part out::

    {
     "schema": "linearize.report", "schema_version": 1, "created": "2026-11-22T07:00:00Z",
     "recipe": {...},            # the full resolved recipe: name, model, task, method, options, layers,
                                 # seed, teacher{}, stage1{}, stage2{}, data{} (shown as YAML)
     "task": {"name": "moviereviews", "kind": "text" | "image", "metric_names": ["accuracy"],
              "primary_metric": "accuracy", "selection_split": "validation", "report_split": "test",
              "num_examples": {"train": 2880, "validation": 320, "test": 800}},
     "model": {"source": "minilm", "architecture": "BertForSequenceClassification", "method": "luna",
               "options": {}, "layers": [0, 1, 2, 3, 4, 5], "num_attention_layers": 6,
               "parameters_base": 22713986, "parameters_added": 5472, "parameters_added_percent": 0.024},
     "scores": {"teacher":        {"validation": {"accuracy": 0.81}, "test": {"accuracy": 0.815}},
                "student_stage1": {"validation": {...}, "test": {...}},   # after stage 1, before fine-tuning
                "student":        {"validation": {...}, "test": {...}}},  # after stage 2
     "recovery": {"split": "test", "per_metric": {"accuracy": 98.2}, "average": 98.2,
                  "stage1_per_metric": {...}, "stage1_average": 91.0},    # student / teacher x 100
     "attention": {"per_layer": [{"layer": 0, "ce_before": 3.1, "kl_before": 1.1, "ce_after": 2.5,
                                  "kl_after": 0.6, "teacher_entropy": 2.0, "student_entropy": 2.2}, ...],
                   "mean_kl_before": 1.1, "mean_kl_after": 0.7, "stage1_skipped": false},
     "timing": {"teacher_seconds": 250.0, "stage1_seconds": 60.0, "stage2_seconds": 300.0,
                "total_seconds": 640.0},
     "latency": {"seq_len": 64, "batch_size": 32, "teacher_ms": 40.1, "student_ms": 38.0, "speedup": 1.05},
     "curves": {"teacher": [{"epoch": 1, "step": 100, "train_loss": 0.5, "lr": 1e-5, "dev_accuracy": 0.8}, ...],
                "stage1":  [{"step": 1, "ce": 3.1, "kl": 1.1, "lr": 1e-3}, ...],
                "stage2":  [{"epoch": 1, "step": 100, "train_loss": 0.4, "lr": 1e-5, "dev_accuracy": 0.79}, ...]},
     "visuals": {
        "luna_channels": [      # method luna only; LUNA Fig. 3; usually the first and last converted layer
            {"layer": 0, "grid": [...],          # ~200 values of u = w_i^T x + b_i over its empirical range
             "psi": [[...], ...],                # len(grid) x L: the L channels psi_l(u) at each grid point
             "hist_edges": [...], "hist_counts": [...]}],   # 41 edges, 40 counts: the empirical u
        "cls_attention": [      # LUNA Fig. 4: attention from [CLS], one layer, mean over heads
            {"text": "a gripping film", "tokens": ["[CLS]", "a", "gripping", "film", "[SEP]"],
             "teacher": [...], "student": [...], "layer": 5},               # text tasks, or for images:
            {"image_index": 3, "grid": [7, 7], "teacher": [...49], "student": [...49], "layer": 5,
             "pixels": [[...]]}]},                # optional H x W grayscale 0-255
     "seeds": {"seed": 0},
     "environment": {"python": "3.11.7", "torch": "...", "transformers": "...", "linearize": "0.1.0",
                     "platform": "...", "cpu": "...", "threads": 2},
     "data_hash": "sha256:...",
     "figures": ["figures/curves.png", "figures/per_layer_kl.png", "figures/luna_channels.png",
                 "figures/cls_attention.png"]      # set by write_report: the figures that exist
    }

Public functions: :func:`load_report`, :func:`validate_report`, :func:`render_markdown`,
:func:`make_figures`, :func:`write_report`, :func:`render_report`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from .errors import LinearizeError
from .io import atomic_write_json, atomic_write_text

SCHEMA = "linearize.report"
SCHEMA_VERSION = 1
REQUIRED_SECTIONS = ("recipe", "task", "model", "scores")
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
FIGURES_DIR = "figures"
FIGURE_NAMES = ("curves.png", "per_layer_kl.png", "luna_channels.png", "cls_attention.png")
CAPTIONS = {
    "curves.png": "Training curves: stage-1 attention distillation (CE and KL to the teacher's attention) "
                  "and task training of the teacher and the student (train loss, dev metric).",
    "per_layer_kl.png": "Per-layer KL between the teacher's softmax attention and the student's linear "
                        "attention, before and after stage 1, and the attention entropies.",
    "luna_channels.png": "LUNA's learned channels ψ_ℓ(u) (lines) over the empirical distribution of "
                         "u = wᵢᵀx + bᵢ (gray histogram), as in LUNA Fig. 3.",
    "cls_attention.png": "Attention from [CLS]: softmax teacher (red) vs linear student (blue), as in LUNA Fig. 4.",
}
TEACHER_COLOR = "#d62728"
STUDENT_COLOR = "#1f77b4"
STAGE1_COLOR = "#7f7f7f"


# ---------------------------------------------------------------- loading and validation

def validate_report(report, where="report"):
    """Raise a one-line :class:`LinearizeError` unless ``report`` is a version-1 linearize report."""
    if not isinstance(report, dict):
        raise LinearizeError(f"{where} is not a JSON object; expected a linearize report (schema {SCHEMA!r})")
    if report.get("schema") != SCHEMA:
        raise LinearizeError(f"{where} has schema {report.get('schema')!r}, not {SCHEMA!r}; "
                             "it was not written by linearize")
    version = report.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        hint = ("upgrade linearize to read it" if isinstance(version, int) and not isinstance(version, bool)
                and version > SCHEMA_VERSION else "re-run the pipeline to write a current one")
        raise LinearizeError(f"{where} has schema_version {version!r}; this linearize reads version "
                             f"{SCHEMA_VERSION} ({hint})")
    missing = [name for name in REQUIRED_SECTIONS if not isinstance(report.get(name), dict)]
    if missing:
        raise LinearizeError(f"{where} lacks the section(s) {', '.join(missing)} (each must be an object); "
                             "re-run the pipeline to write a complete report")
    return report


def load_report(path):
    """Read and validate ``report.json`` (``path`` is the file or the run folder holding it)."""
    path = Path(path)
    if not path.exists():
        raise LinearizeError(f"{path} does not exist; pass a run folder that holds {REPORT_JSON}")
    if path.is_dir():
        path = path / REPORT_JSON
    if not path.is_file():
        raise LinearizeError(f"no report at {path}; pass a run folder that holds {REPORT_JSON} "
                             "(the pipeline writes it at the end of a run)")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise LinearizeError(f"{path} is not valid JSON ({reason}); re-run the pipeline to rewrite it") from None
    return validate_report(report, where=str(path))


# ---------------------------------------------------------------- small helpers

def _section(report, name):
    value = report.get(name)
    return value if isinstance(value, dict) else {}


def _number(value):
    """``value`` as a finite float, or None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _fmt_score(value):
    value = _number(value)
    if value is None:
        return "—"
    return f"{value:.3f}" if abs(value) <= 1.5 else f"{value:.2f}"


def _fmt_pct(value, bold=False):
    value = _number(value)
    if value is None:
        return "—"
    text = f"{value:.1f}%"
    return f"**{text}**" if bold else text


def _fmt_small_pct(value):
    """A percentage that may be tiny (parameter overhead): three significant digits."""
    value = _number(value)
    if value is None:
        return "—"
    return f"{value:.3g}%" if value < 100 else f"{value:.1f}%"


def _fmt_loss(value):
    value = _number(value)
    return "—" if value is None else f"{value:.3f}"


def _fmt_count(value):
    value = _number(value)
    return "—" if value is None else f"{int(round(value)):,}"


def _fmt_seconds(value):
    value = _number(value)
    if value is None:
        return "—"
    if value < 90:
        return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"
    if value < 90 * 60:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.2f} h"


def _fmt_ms(value):
    value = _number(value)
    if value is None:
        return "—"
    return f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms"


def _md_escape(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header, rows, align=None):
    align = align or ["left"] + ["right"] * (len(header) - 1)
    marks = {"left": ":--", "right": "--:", "center": ":-:"}
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks[a] for a in align) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _split_scores(report, who, split):
    entry = _section(report, "scores").get(who)
    if not isinstance(entry, dict):
        return {}
    scores = entry.get(split)
    return scores if isinstance(scores, dict) else {}


def _metric_names(report):
    task = _section(report, "task")
    names = task.get("metric_names")
    if isinstance(names, list) and names:
        return [str(n) for n in names]
    seen = []
    for who in ("teacher", "student", "student_stage1"):
        for split in (_report_split(report), task.get("selection_split")):
            for name in _split_scores(report, who, split):
                if name not in seen:
                    seen.append(name)
    return seen


def _primary_metric(report):
    primary = _section(report, "task").get("primary_metric")
    names = _metric_names(report)
    return primary if primary else (names[0] if names else "score")


def _report_split(report):
    task = _section(report, "task")
    return (_section(report, "recovery").get("split") or task.get("report_split")
            or task.get("selection_split") or "test")


def _ratio(student, teacher):
    student, teacher = _number(student), _number(teacher)
    if student is None or teacher is None or abs(teacher) < 1e-12:
        return None
    return 100.0 * student / teacher


def _recovery(report, stage):
    """``(per_metric, average)`` for ``stage`` in {"student", "student_stage1"}: from the report's
    ``recovery`` section when present, else computed from the scores on the report split."""
    recovery = _section(report, "recovery")
    per_key, avg_key = ("per_metric", "average") if stage == "student" else ("stage1_per_metric", "stage1_average")
    per_metric = recovery.get(per_key) if isinstance(recovery.get(per_key), dict) else None
    average = _number(recovery.get(avg_key))
    if per_metric is None:
        split = _report_split(report)
        teacher, student = _split_scores(report, "teacher", split), _split_scores(report, stage, split)
        per_metric = {name: _ratio(student.get(name), teacher.get(name)) for name in _metric_names(report)}
        per_metric = {k: v for k, v in per_metric.items() if v is not None}
    if average is None and per_metric:
        values = [_number(v) for v in per_metric.values() if _number(v) is not None]
        average = sum(values) / len(values) if values else None
    return per_metric or {}, average


def _per_layer(report):
    rows = _section(report, "attention").get("per_layer")
    return [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []


def _worst_layer(report):
    """``(layer row, key)`` of the layer whose attention stays furthest from the teacher's."""
    rows = _per_layer(report)
    skipped = bool(_section(report, "attention").get("stage1_skipped"))
    keys = ("kl_before", "ce_before") if skipped else ("kl_after", "ce_after", "kl_before", "ce_before")
    for key in keys:
        candidates = [row for row in rows if _number(row.get(key)) is not None]
        if len(candidates) >= 1:
            return max(candidates, key=lambda row: _number(row[key])), key
    return None, None


def _mean(values):
    values = [v for v in (_number(x) for x in values) if v is not None]
    return sum(values) / len(values) if values else None


def _display_token(token):
    """Tokenizer markers that only say "a word starts here" are dropped for display."""
    token = str(token)
    for marker in ("Ġ", "▁"):
        if token.startswith(marker) and len(token) > 1:
            token = token[1:]
    return token


def _is_special(token):
    token = str(token)
    return bool(re.fullmatch(r"\[[A-Z]+\]|<\/?s>|<pad>|<unk>|<mask>|<cls>|<sep>", token))


# ---------------------------------------------------------------- markdown

def render_markdown(report):
    """``report.md`` as a string. Sections whose data are absent are left out."""
    task, model, recipe = _section(report, "task"), _section(report, "model"), _section(report, "recipe")
    source = model.get("source") or recipe.get("model") or "model"
    method = model.get("method") or recipe.get("method") or "linear attention"
    task_name = task.get("name") or recipe.get("task") or "task"
    out = [f"# {source} → {method} on {task_name}", ""]
    meta = []
    if recipe.get("name"):
        meta.append(f"recipe `{recipe['name']}`")
    if report.get("created"):
        meta.append(f"created {report['created']}")
    seed = _section(report, "seeds").get("seed", recipe.get("seed"))
    if seed is not None:
        meta.append(f"seed {seed}")
    if meta:
        out += [" · ".join(meta), ""]
    out += _summary(report) + [""]
    for part in (_scores_section, _model_section, _attention_section, _timing_section, _latency_section,
                 _figures_section, _reproducibility_section):
        lines = part(report)
        if lines:
            out += lines + [""]
    return "\n".join(out).rstrip() + "\n"


def _summary(report):
    split = _report_split(report)
    names = _metric_names(report)
    per_metric, average = _recovery(report, "student")
    lines = []
    if average is not None:
        if len(per_metric) == 1 or len(names) == 1:
            metric = next(iter(per_metric), names[0] if names else "score")
            teacher = _split_scores(report, "teacher", split).get(metric)
            student = _split_scores(report, "student", split).get(metric)
            detail = ""
            if _number(teacher) is not None and _number(student) is not None:
                detail = f" (student {_fmt_score(student)}, teacher {_fmt_score(teacher)})"
            lines.append(f"**The linear student keeps {_fmt_pct(average)} of the teacher's {metric} on the "
                         f"{split} split**{detail}.")
        else:
            parts = ", ".join(f"{k} {_fmt_pct(v)}" for k, v in per_metric.items())
            lines.append(f"**The linear student keeps {_fmt_pct(average)} of the teacher's score on the {split} "
                         f"split** (average over metrics: {parts}).")
        _, stage1_average = _recovery(report, "student_stage1")
        if stage1_average is not None:
            lines[-1] += f" After stage 1 alone, before fine-tuning, it kept {_fmt_pct(stage1_average)}."
    else:
        lines.append(f"No student score on the {split} split was recorded, so the recovery is unknown.")
    attention = _section(report, "attention")
    before = _number(attention.get("mean_kl_before"))
    after = _number(attention.get("mean_kl_after"))
    if before is None:
        before = _mean(row.get("kl_before") for row in _per_layer(report))
    if after is None:
        after = _mean(row.get("kl_after") for row in _per_layer(report))
    worst, key = _worst_layer(report)
    if attention.get("stage1_skipped") and before is not None:
        text = f"Stage 1 was skipped; attention KL to the teacher, mean over layers: {before:.3f}"
    elif before is not None and after is not None:
        text = f"Attention KL to the teacher, mean over layers: {before:.3f} → {after:.3f} through stage 1"
    elif before is not None or after is not None:
        text = f"Attention KL to the teacher, mean over layers: {(before if before is not None else after):.3f}"
    else:
        text = None
    if text:
        if worst is not None and key.startswith("kl"):
            text += f"; layer {worst.get('layer')} lags most ({_number(worst[key]):.3f})"
        lines += ["", text + "."]
    return lines


def _scores_section(report):
    task = _section(report, "task")
    split = _report_split(report)
    selection = task.get("selection_split")
    names = _metric_names(report)
    stages = [("teacher", "teacher (softmax)"), ("student_stage1", "student after stage 1"),
              ("student", "student after stage 2")]
    stages = [(key, label) for key, label in stages
              if key == "teacher" or _split_scores(report, key, split) or _split_scores(report, key, selection)]
    if not names:
        return []
    lines = ["## Scores", ""]
    multi = len(names) > 1
    header = ["model"] + [f"{name} ({split})" for name in names]
    header.append("recovery (average)" if multi else "recovery")
    rows = []
    for key, label in stages:
        scores = _split_scores(report, key, split)
        if key == "teacher":
            per_metric, average = ({n: 100.0 for n in names if _number(scores.get(n)) is not None},
                                   100.0 if scores else None)
        else:
            per_metric, average = _recovery(report, key)
        cells = []
        for name in names:
            cell = _fmt_score(scores.get(name))
            if multi and key != "teacher" and _number(per_metric.get(name)) is not None:
                cell += f" ({_fmt_pct(per_metric[name])})"
            cells.append(cell)
        rows.append([label] + cells + [_fmt_pct(average, bold=(key == "student"))])
    lines.append(_table(header, rows))
    lines += ["", f"Recovery = student ÷ teacher × 100 on the {split} split (LUNA Table 2)."]
    if selection and selection != split:
        sel_rows = []
        for key, label in stages:
            scores = _split_scores(report, key, selection)
            if scores:
                sel_rows.append([label] + [_fmt_score(scores.get(name)) for name in names])
        if sel_rows:
            lines += ["", f"On the {selection} split (used for model selection and early stopping):", "",
                      _table(["model"] + [f"{name} ({selection})" for name in names], sel_rows)]
    # A noise yardstick for accuracies: a difference smaller than ~2 standard errors is not a difference.
    n = _number(_section(task, "num_examples").get(split))
    teacher_acc = _number(_split_scores(report, "teacher", split).get("accuracy"))
    if n and n > 0 and teacher_acc is not None and 0 <= teacher_acc <= 1:
        se = math.sqrt(teacher_acc * (1 - teacher_acc) / n)
        lines += ["", f"With {int(n):,} {split} examples one standard error of the accuracy is about "
                      f"{100 * se:.1f} points ({100 * se / teacher_acc:.1f} recovery points): compare runs over "
                      "several seeds before trusting small differences."]
    if task:
        facts = []
        if task.get("kind"):
            facts.append(f"{task['kind']} task")
        primary = _primary_metric(report)
        if primary:
            facts.append(f"primary metric {primary}")
        counts = task.get("num_examples")
        if isinstance(counts, dict) and counts:
            facts.append("examples: " + ", ".join(f"{k} {_fmt_count(v)}" for k, v in counts.items()))
        if facts:
            lines += ["", "Task: " + "; ".join(facts) + "."]
    return lines


def _model_section(report):
    model = _section(report, "model")
    if not model:
        return []
    rows = []
    if model.get("architecture"):
        rows.append(("architecture", f"`{model['architecture']}`"))
    if model.get("source"):
        rows.append(("source", f"`{model['source']}`"))
    if model.get("method"):
        rows.append(("method", f"`{model['method']}`"))
    options = model.get("options")
    if isinstance(options, dict):
        rows.append(("options", ", ".join(f"{k}={v}" for k, v in options.items()) or "defaults"))
    layers = model.get("layers")
    total = model.get("num_attention_layers")
    if isinstance(layers, list):
        text = f"{len(layers)}" + (f" of {total}" if total is not None else "") + f": {layers}"
        if total is not None and len(layers) != total:
            text += " (the others stay softmax)"
        rows.append(("converted layers", text))
    if _number(model.get("parameters_added")) is not None:
        text = f"{_fmt_count(model['parameters_added'])}"
        if _number(model.get("parameters_added_percent")) is not None:
            text += f" ({_fmt_small_pct(model['parameters_added_percent'])}"
            text += f" of {_fmt_count(model['parameters_base'])})" if _number(model.get("parameters_base")) else ")"
        rows.append(("parameters added", text))
    elif _number(model.get("parameters_base")) is not None:
        rows.append(("parameters", _fmt_count(model["parameters_base"])))
    if not rows:
        return []
    return ["## Model", "", _table(["", ""], [(f"**{k}**", _md_escape(v)) for k, v in rows], ["left", "left"])]


def _attention_section(report):
    attention = _section(report, "attention")
    rows = _per_layer(report)
    if not rows:
        return []
    skipped = bool(attention.get("stage1_skipped"))
    lines = ["## Attention distillation per layer", ""]
    if skipped:
        lines += ["Stage 1 was skipped (by the recipe, or because the method learns nothing in its feature maps): "
                  "these are the distances of the untrained conversion.", ""]
    columns = [key for key in ("ce", "kl") if any(_number(r.get(f"{key}_before")) is not None
                                                   or _number(r.get(f"{key}_after")) is not None for r in rows)]
    has_entropy = any(_number(r.get("teacher_entropy")) is not None or _number(r.get("student_entropy")) is not None
                      for r in rows)
    worst, worst_key = _worst_layer(report)
    header = ["layer"]
    for key in columns:
        header.append(f"{key.upper()} (untrained)" if skipped else f"{key.upper()} before → after")
    if has_entropy:
        header += ["teacher entropy", "student entropy", "gap"]
    header.append("")
    table_rows = []
    for row in rows:
        cells = [str(row.get("layer", "?"))]
        for key in columns:
            before, after = row.get(f"{key}_before"), row.get(f"{key}_after")
            if skipped or _number(after) is None:
                cells.append(_fmt_loss(before))
            else:
                cells.append(f"{_fmt_loss(before)} → {_fmt_loss(after)}")
        if has_entropy:
            t, s = _number(row.get("teacher_entropy")), _number(row.get("student_entropy"))
            cells += [_fmt_loss(t), _fmt_loss(s), f"{s - t:+.3f}" if t is not None and s is not None else "—"]
        is_worst = row is worst
        if is_worst:  # bold the layer and its distances (not the entropies)
            cells[: 1 + len(columns)] = [f"**{c}**" if c != "—" else c for c in cells[: 1 + len(columns)]]
        cells.append("◀ worst" if is_worst else "")
        table_rows.append(cells)
    if not any(table_rows[i][-1] for i in range(len(table_rows))):
        header.pop()
        table_rows = [r[:-1] for r in table_rows]
    lines.append(_table(header, table_rows))
    notes = ["CE: cross-entropy of the student's attention rows against the teacher's; KL = CE − teacher "
             "entropy (0 = identical attention), in nats, averaged over heads and query rows."]
    if has_entropy:
        notes.append("A positive entropy gap means the student attends more diffusely than the teacher.")
    before = _number(attention.get("mean_kl_before"))
    after = _number(attention.get("mean_kl_after"))
    if before is not None and after is not None and not skipped:
        if before <= 0:
            notes.append(f"Mean KL {before:.3f} → {after:.3f}.")
        elif after >= before:
            notes.append(f"Mean KL {before:.3f} → {after:.3f}: stage 1 did not lower it — the map did not learn "
                         "the teacher's attention (try a lower stage-1 lr, more epochs, or another method).")
        else:
            notes.append(f"Mean KL {before:.3f} → {after:.3f} ({100 * (before - after) / before:.0f}% lower).")
    elif before is not None:
        notes.append(f"Mean KL {before:.3f}.")
    if worst is not None and len(rows) > 1:
        value = _number(worst[worst_key])
        others = _mean(r.get(worst_key) for r in rows if r is not worst)
        if others is not None:
            what = {"kl_after": "KL after stage 1", "ce_after": "CE after stage 1", "kl_before": "KL",
                    "ce_before": "CE"}[worst_key]
            lever = "running stage 1" if skipped else "a longer or stronger stage 1"
            notes.append(f"Layer {worst.get('layer')} lags most ({what} {value:.3f}, vs {others:.3f} on average "
                         f"in the other layers): {lever}, or keeping that layer softmax, are the levers to try.")
    lines += ["", " ".join(notes)]
    return lines


def _timing_section(report):
    timing = _section(report, "timing")
    stages = [("teacher fine-tuning (softmax)", "teacher_seconds"),
              ("stage 1: attention distillation", "stage1_seconds"),
              ("stage 2: task fine-tuning", "stage2_seconds")]
    rows = [(label, timing.get(key)) for label, key in stages if _number(timing.get(key)) is not None]
    total = _number(timing.get("total_seconds"))
    if not rows and total is None:
        return []
    table_rows = []
    for label, seconds in rows:
        share = f"{100 * _number(seconds) / total:.0f}%" if total else "—"
        table_rows.append([label, _fmt_seconds(seconds), share])
    if total is not None:
        table_rows.append(["**total**", f"**{_fmt_seconds(total)}**", "100%"])
    return ["## Time", "", _table(["stage", "wall time", "share"], table_rows)]


def _latency_section(report):
    latency = _section(report, "latency")
    teacher, student = _number(latency.get("teacher_ms")), _number(latency.get("student_ms"))
    if teacher is None and student is None:
        return []
    speedup = _number(latency.get("speedup"))
    if speedup is None and teacher and student:
        speedup = teacher / student
    shape = []
    if latency.get("batch_size") is not None:
        shape.append(f"batch {latency['batch_size']}")
    if latency.get("seq_len") is not None:
        shape.append(f"sequence length {latency['seq_len']}")
    lines = ["## Inference latency", ""]
    rows = [["teacher (softmax attention)", _fmt_ms(teacher)], ["student (linear attention)", _fmt_ms(student)]]
    if speedup is not None:
        rows.append(["speedup", f"**{speedup:.2f}×**" + (" (slower)" if speedup < 1 else "")])
    lines.append(_table(["forward pass" + (f" ({', '.join(shape)})" if shape else ""), "time"], rows))
    lines += ["", "Linear attention's advantage grows with sequence length; at short lengths the feature map's "
                  "overhead can outweigh it."]
    return lines


def _figures_section(report):
    figures = report.get("figures")
    if not isinstance(figures, list) or not figures:
        return []
    lines = ["## Figures", ""]
    for figure in figures:
        name = Path(str(figure)).name
        caption = CAPTIONS.get(name, name)
        lines += [f"![{Path(name).stem.replace('_', ' ')}]({figure})", "", f"*{caption}*", ""]
    return lines[:-1]


def _reproducibility_section(report):
    lines = ["## Reproducibility", ""]
    recipe = report.get("recipe")
    if isinstance(recipe, dict) and recipe:
        import yaml

        text = yaml.safe_dump(_plain(recipe), sort_keys=False, default_flow_style=False, allow_unicode=True,
                              width=100).rstrip()
        lines += ["The resolved recipe:", "", "```yaml", text, "```", ""]
    facts = []
    seeds = _section(report, "seeds")
    if seeds:
        facts.append(("seeds", ", ".join(f"{k}={v}" for k, v in seeds.items())))
    if report.get("data_hash"):
        facts.append(("data hash", f"`{report['data_hash']}`"))
    environment = _section(report, "environment")
    for key, value in environment.items():
        if value is not None:
            facts.append((key, f"`{value}`" if key in ("python", "torch", "transformers", "linearize") else str(value)))
    if report.get("created"):
        facts.append(("created", str(report["created"])))
    if facts:
        lines.append(_table(["", ""], [(f"**{k}**", _md_escape(v)) for k, v in facts], ["left", "left"]))
    lines += ["", f"`linearize report RUN_DIR` re-renders this file and the figures from `{REPORT_JSON}`."]
    return lines


def _plain(value):
    """JSON-like plain data (tuples, paths, numpy/torch scalars -> lists, strings, numbers)."""
    return json.loads(json.dumps(value, default=_json_default))


def _json_default(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


# ---------------------------------------------------------------- figures

def _new_figure(width, height):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save_figure(fig, path):
    """Save through a temporary file beside ``path`` (``io.atomic_path``): never a half-written PNG."""
    from .io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=fig.dpi, facecolor="white")


def _style(ax):
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.grid(True, color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.tick_params(labelsize=9)


def _smooth(values, window):
    """Centered moving average (the ends use a shorter window)."""
    if window <= 1:
        return list(values)
    half = window // 2
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - half): i + half + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def _series(entries, key):
    """``(x, y, xlabel)`` of ``key`` over epochs (steps when the log has several entries per epoch)."""
    rows = [e for e in entries if isinstance(e, dict) and _number(e.get(key)) is not None]
    if not rows:
        return [], [], None
    epochs = [_number(e.get("epoch")) for e in entries if isinstance(e, dict)]
    use_epoch = all(v is not None for v in epochs) and len(set(epochs)) == len(epochs)
    if use_epoch:
        return [_number(e["epoch"]) for e in rows], [_number(e[key]) for e in rows], "epoch"
    if all(_number(e.get("step")) is not None for e in rows):
        return [_number(e["step"]) for e in rows], [_number(e[key]) for e in rows], "step"
    return list(range(1, len(rows) + 1)), [_number(e[key]) for e in rows], "log entry"


def _plot_noisy(ax, x, y, color, label, marker=None):
    if len(y) > 30:
        ax.plot(x, y, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(x, _smooth(y, max(3, len(y) // 20)), color=color, linewidth=1.8, label=label)
    else:
        ax.plot(x, y, color=color, linewidth=1.8, label=label, marker=marker or "o", markersize=4)


def _curves_figure(report):
    curves = _section(report, "curves")
    stage1 = curves.get("stage1") if isinstance(curves.get("stage1"), list) else []
    runs = [(name, label, color) for name, label, color in
            (("teacher", "teacher (softmax)", TEACHER_COLOR), ("stage2", "student (stage 2)", STUDENT_COLOR))
            if isinstance(curves.get(name), list) and curves.get(name)]
    primary = _primary_metric(report)
    dev_key = f"dev_{primary}"
    panels = []
    if any(_series(stage1, k)[0] for k in ("ce", "kl")):
        panels.append("stage1")
    if any(_series(curves[name], "train_loss")[0] for name, _, _ in runs):
        panels.append("loss")
    if not any(_series(curves[name], dev_key)[0] for name, _, _ in runs):
        keys = {k for name, _, _ in runs for e in curves[name] if isinstance(e, dict)
                for k in e if k.startswith("dev_")}
        dev_key = sorted(keys)[0] if keys else None
    if dev_key and any(_series(curves[name], dev_key)[0] for name, _, _ in runs):
        panels.append("dev")
    if not panels:
        return None
    fig = _new_figure(4.6 * len(panels), 3.6)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        _style(ax)
        if panel == "stage1":
            for key, label, color in (("ce", "cross-entropy", "#ff7f0e"), ("kl", "KL", "#2ca02c")):
                x, y, xlabel = _series(stage1, key)
                if x:
                    _plot_noisy(ax, x, y, color, label)
            ax.set_xlabel(xlabel or "step")
            ax.set_ylabel("nats")
            ax.set_title("Stage 1: attention distillation", fontsize=11)
        else:
            key = "train_loss" if panel == "loss" else dev_key
            xlabels = set()
            for name, label, color in runs:
                x, y, xlabel = _series(curves[name], key)
                if not x:
                    continue
                xlabels.add(xlabel)
                _plot_noisy(ax, x, y, color, label)
                if panel == "dev" and len(y) > 1:
                    best = max(range(len(y)), key=lambda i: y[i])
                    ax.plot([x[best]], [y[best]], marker="*", markersize=13, color=color, markeredgecolor="black",
                            markeredgewidth=0.6, linestyle="none", zorder=5)
            ax.set_xlabel(" / ".join(sorted(xlabels)) or "epoch")
            if xlabels == {"epoch"}:
                from matplotlib.ticker import MaxNLocator

                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if panel == "loss":
                ax.set_ylabel("train loss")
                ax.set_title("Task training loss", fontsize=11)
            else:
                metric = dev_key[len("dev_"):]
                ax.set_ylabel(f"dev {metric}")
                selection = _section(report, "task").get("selection_split")
                ax.set_title(f"Dev {metric}" + (f" ({selection})" if selection else "") + ", ★ = best", fontsize=11)
        ax.legend(fontsize=8.5, frameon=False)
    fig.tight_layout()
    return fig


def _per_layer_figure(report):
    rows = _per_layer(report)
    attention = _section(report, "attention")
    skipped = bool(attention.get("stage1_skipped"))
    kl_rows = [r for r in rows if _number(r.get("kl_before")) is not None or _number(r.get("kl_after")) is not None]
    entropy_rows = [r for r in rows if _number(r.get("teacher_entropy")) is not None
                    and _number(r.get("student_entropy")) is not None]
    if not kl_rows:
        return None
    ncols = 2 if entropy_rows else 1
    width = max(4.8, 0.55 * len(kl_rows) + 2.5)
    fig = _new_figure(width * ncols, 3.6)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    ax = axes[0]
    _style(ax)
    ax.grid(axis="x", visible=False)
    labels = [str(r.get("layer", i)) for i, r in enumerate(kl_rows)]
    positions = list(range(len(kl_rows)))
    before = [_number(r.get("kl_before")) or 0.0 for r in kl_rows]
    after = [_number(r.get("kl_after")) for r in kl_rows]
    has_after = not skipped and any(v is not None for v in after)
    bar_width = 0.4 if has_after else 0.6
    offset = bar_width / 2 if has_after else 0.0
    ax.bar([p - offset for p in positions], before, bar_width, color="#c7c7c7", edgecolor="#8c8c8c", linewidth=0.6,
           label="untrained conversion" if skipped else "before stage 1")
    if has_after:
        ax.bar([p + offset for p in positions], [v or 0.0 for v in after], bar_width, color=STUDENT_COLOR,
               label="after stage 1")
    worst, key = _worst_layer(report)
    if worst is not None and worst in kl_rows and key.startswith("kl") and len(kl_rows) > 1:
        i = kl_rows.index(worst)
        height = _number(worst[key])
        x = positions[i] + (offset if key == "kl_after" else -offset)
        ax.annotate("worst", (x, height), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=8.5,
                    color=TEACHER_COLOR, fontweight="bold")
    ax.set_xticks(positions, labels)
    ax.set_xlabel("layer")
    ax.set_ylabel("KL(teacher ‖ student), nats")
    top = max(before + [v or 0.0 for v in after])
    ax.set_ylim(0, top * 1.18 if top > 0 else 1)
    ax.set_title("Attention KL to the teacher per layer", fontsize=11)
    ax.legend(fontsize=8.5, frameon=False)
    if entropy_rows:
        ax = axes[1]
        _style(ax)
        xs = list(range(len(entropy_rows)))
        ax.plot(xs, [_number(r["teacher_entropy"]) for r in entropy_rows], marker="o", color=TEACHER_COLOR,
                label="teacher (softmax)")
        ax.plot(xs, [_number(r["student_entropy"]) for r in entropy_rows], marker="s", color=STUDENT_COLOR,
                label="student (linear)")
        ax.set_xticks(xs, [str(r.get("layer", i)) for i, r in enumerate(entropy_rows)])
        ax.set_xlabel("layer")
        ax.set_ylabel("attention entropy, nats")
        ax.set_title("Attention entropy (higher = more diffuse)", fontsize=11)
        ax.legend(fontsize=8.5, frameon=False)
    fig.tight_layout()
    return fig


def _luna_entries(report):
    entries = _section(report, "visuals").get("luna_channels")
    good = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        grid, psi = entry.get("grid"), entry.get("psi")
        if not (isinstance(grid, list) and isinstance(psi, list) and grid and psi):
            continue
        if len(psi) != len(grid) and isinstance(psi[0], list) and len(psi[0]) == len(grid):
            psi = [list(column) for column in zip(*psi)]  # given as L x len(grid)
        if len(psi) != len(grid):
            continue
        psi = [row if isinstance(row, list) else [row] for row in psi]
        good.append({**entry, "psi": psi})
    return good


def _luna_figure(report):
    entries = _luna_entries(report)
    if not entries:
        return None
    channels = max(len(e["psi"][0]) for e in entries)
    cols = min(channels, 8)
    rows_per_layer = math.ceil(channels / cols)
    nrows = rows_per_layer * len(entries)
    from matplotlib.ticker import MaxNLocator

    width, height = 1.75 * cols + 0.6, 1.55 * nrows + 0.75
    fig = _new_figure(width, height)
    # Fixed margins and tick positions: tight_layout and tick locators over dozens of small axes are slow.
    fig.subplots_adjust(left=0.75 / width, right=1 - 0.12 / width, bottom=0.5 / height, top=1 - 0.6 / height,
                        wspace=0.22, hspace=0.5)
    axes = fig.subplots(nrows, cols, squeeze=False)
    for li, entry in enumerate(entries):
        grid = [_number(v) or 0.0 for v in entry["grid"]]
        psi = entry["psi"]
        edges, counts = entry.get("hist_edges"), entry.get("hist_counts")
        has_hist = (isinstance(edges, list) and isinstance(counts, list) and len(edges) == len(counts) + 1
                    and len(counts) > 0)
        values = [_number(v) for row in psi for v in row]
        top = max([v for v in values if v is not None] + [0.0])
        top = top * 1.1 if top > 0 else 1.0
        lo, hi = min(grid), max(grid)
        xticks = [t for t in MaxNLocator(nbins=4).tick_values(lo, hi) if lo <= t <= hi]
        yticks = [t for t in MaxNLocator(nbins=3).tick_values(0, top) if 0 <= t <= top]
        for c in range(rows_per_layer * cols):
            ax = axes[li * rows_per_layer + c // cols][c % cols]
            if c >= len(psi[0]):
                ax.set_visible(False)
                continue
            if has_hist:  # the histogram scaled into the channel's axes, behind the line
                heights = [_number(v) or 0.0 for v in counts]
                peak = max(heights) or 1.0
                ax.stairs([0.95 * top * h / peak for h in heights], [_number(v) or 0.0 for v in edges], fill=True,
                          color="#dcdcdc", zorder=0)
            y = [_number(row[c]) if c < len(row) else None for row in psi]
            y = [v if v is not None else float("nan") for v in y]
            ax.plot(grid, y, color=STUDENT_COLOR, linewidth=1.6)
            ax.set_ylim(-0.03 * top, top)
            ax.set_xlim(lo, hi)
            ax.set_xticks(xticks)
            ax.set_yticks(yticks)
            ax.tick_params(labelsize=7, length=2)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
            ax.set_title(f"ψ$_{{{c + 1}}}$", fontsize=9, pad=2)
            if max((abs(v) for v in y if v == v), default=0.0) < 1e-6:
                ax.text(0.5, 0.5, "dead", transform=ax.transAxes, ha="center", va="center", fontsize=9,
                        color="#8a8a8a", style="italic",
                        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5})
            if c % cols == 0:
                ax.set_ylabel(f"layer {entry.get('layer', '?')}\nψ(u)", fontsize=9)
            else:
                ax.tick_params(labelleft=False)
            last_row = (li == len(entries) - 1) and (c // cols == rows_per_layer - 1)
            if last_row:
                ax.set_xlabel("u", fontsize=9)
    fig.suptitle("LUNA channels ψ$_ℓ$(u) over the empirical distribution of u = wᵢᵀx + bᵢ (gray)", fontsize=11,
                 y=1 - 0.12 / height, va="top")
    return fig


def _cls_entries(report):
    entries = _section(report, "visuals").get("cls_attention")
    good = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        teacher, student = entry.get("teacher"), entry.get("student")
        if not (isinstance(teacher, list) and isinstance(student, list) and teacher and len(teacher) == len(student)):
            continue
        if isinstance(entry.get("tokens"), list) and len(entry["tokens"]) == len(teacher):
            good.append(("text", entry))
        elif isinstance(entry.get("grid"), list) and len(entry["grid"]) == 2:
            gh, gw = (int(v) for v in entry["grid"])
            if len(teacher) == gh * gw + 1:  # the [CLS] token itself came along: drop it
                entry = {**entry, "teacher": teacher[1:], "student": student[1:]}
            if len(entry["teacher"]) == gh * gw:
                good.append(("image", entry))
    kinds = {kind for kind, _ in good}
    if len(kinds) > 1:  # one figure shows one kind; text wins, as the task kind decides it normally
        want = "image" if _section(report, "task").get("kind") == "image" else "text"
        good = [(k, e) for k, e in good if k == want]
    return good


def _cls_figure(report):
    entries = _cls_entries(report)
    if not entries:
        return None
    if entries[0][0] == "text":
        return _cls_text_figure(report, [e for _, e in entries])
    return _cls_image_figure(report, [e for _, e in entries])


def _cls_text_figure(report, entries):
    import matplotlib.patches as patches
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath

    fontsize, pad, gap = 11.0, 3.5, 3.0
    box_h, row_gap, line_gap, sentence_gap = 17.0, 2.0, 7.0, 16.0
    label_w, width = 62.0, 760.0
    prop = FontProperties(size=fontsize)

    def text_width(text):
        return TextPath((0, 0), text, prop=prop).get_extents().width if text.strip() else fontsize * 0.4

    # Lay out: each sentence is wrapped into lines; each line shows a teacher row and a student row.
    layout, y = [], 44.0
    for entry in entries:
        tokens = [_display_token(t) for t in entry["tokens"]]
        teacher = [max(_number(v) or 0.0, 0.0) for v in entry["teacher"]]
        student = [max(_number(v) or 0.0, 0.0) for v in entry["student"]]
        # Shade against the largest weight on a content token: [CLS]/[SEP] often soak up most of the
        # attention, and normalising by them would wash every word out (they are clipped instead).
        content = [i for i, t in enumerate(entry["tokens"]) if not _is_special(t)] or list(range(len(tokens)))
        scale = max([teacher[i] for i in content] + [student[i] for i in content]) or 1.0
        x, line = label_w, []
        lines = [line]
        for i, token in enumerate(tokens):
            w = text_width(token) + 2 * pad
            if x + w > width - 8 and line:
                x, line = label_w, []
                lines.append(line)
            line.append((i, token, x, w))
            x += w + gap
        for n, line in enumerate(lines):
            layout.append((y, line, teacher, student, scale, n == 0))
            y += 2 * box_h + row_gap + line_gap
        y += sentence_gap - line_gap
    height = y + 4
    fig = _new_figure(width / 72, height / 72)
    fig.dpi = 110
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    layers = list(dict.fromkeys(str(e["layer"]) for e in entries if e.get("layer") is not None))
    where = f"layer {', '.join(layers)}, " if layers else ""
    ax.text(label_w, 13, f"Attention from [CLS] ({where}mean over heads): softmax teacher vs linear student",
            fontsize=11, va="center", parse_math=False)
    ax.text(label_w, 28, "shade ∝ attention weight, one scale per sentence (weights above the largest word's "
            "are clipped, e.g. on [CLS]/[SEP])", fontsize=8.5, color="#777777", va="center", parse_math=False)
    from matplotlib.colors import to_rgb

    for y0, line, teacher, student, scale, first in layout:
        if first and y0 > 45:
            ax.plot([label_w - 50, width - 8], [y0 - sentence_gap / 2 - 1] * 2, color="#e3e3e3", linewidth=0.8)
        for r, (weights, color, label) in enumerate(((teacher, TEACHER_COLOR, "teacher"),
                                                     (student, STUDENT_COLOR, "student"))):
            top = y0 + r * (box_h + row_gap)
            ax.text(label_w - 8, top + box_h / 2, label, color=color, fontsize=9, ha="right", va="center",
                    parse_math=False)
            for i, token, x, w in line:
                strength = min(weights[i] / scale, 1.0)
                rgb = to_rgb(color)
                face = tuple(1 - (1 - c) * (0.06 + 0.94 * strength) for c in rgb)  # blend with white
                ax.add_patch(patches.FancyBboxPatch((x, top), w, box_h, boxstyle="round,pad=0,rounding_size=3",
                                                    facecolor=face, edgecolor="#d0d0d0", linewidth=0.5))
                ax.text(x + w / 2, top + box_h / 2 + 0.5, token, fontsize=fontsize, ha="center", va="center",
                        color="white" if strength > 0.6 else "#111111", parse_math=False)
    return fig


def _cls_image_figure(report, entries):
    import numpy as np
    from matplotlib.colors import to_rgb

    entries = entries[:6]

    def image_of(entry):
        pixels = entry.get("pixels")
        if not (isinstance(pixels, list) and pixels):
            return None
        try:
            array = np.asarray(pixels, dtype=float)
        except (TypeError, ValueError):
            return None
        if array.ndim == 3 and array.shape[-1] in (3, 4):
            return np.clip(array / 255.0, 0, 1)
        return array if array.ndim == 2 else None

    def overlay(weights, color, vmax, gh, gw):
        """The patch grid as RGBA: the role's colour with opacity proportional to the weight."""
        rgba = np.zeros((gh, gw, 4))
        rgba[..., :3] = to_rgb(color)
        rgba[..., 3] = 0.04 + 0.86 * np.clip(np.asarray(weights, dtype=float).reshape(gh, gw) / vmax, 0, 1)
        return rgba

    images = [image_of(e) for e in entries]
    has_pixels = any(image is not None for image in images)
    ncols = 3 if has_pixels else 2
    fig = _new_figure(2.5 * ncols + 0.3, 2.55 * len(entries) + 0.45)
    axes = fig.subplots(len(entries), ncols, squeeze=False)
    for r, (entry, image) in enumerate(zip(entries, images)):
        gh, gw = (int(v) for v in entry["grid"])
        teacher = [_number(v) or 0.0 for v in entry["teacher"]]
        student = [_number(v) or 0.0 for v in entry["student"]]
        vmax = max(teacher + student) or 1.0
        name = f"image {entry['image_index']}" if entry.get("image_index") is not None else f"example {r + 1}"
        col = 0
        if has_pixels:
            ax = axes[r][0]
            if image is not None:
                ax.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
            ax.set_title(name, fontsize=10)
            col = 1
        for weights, color, label in ((teacher, TEACHER_COLOR, "teacher (softmax)"),
                                      (student, STUDENT_COLOR, "student (linear)")):
            ax = axes[r][col]
            if image is not None:
                extent = (-0.5, image.shape[1] - 0.5, image.shape[0] - 0.5, -0.5)
                # the image faded towards white, so the colour on top reads on dark images too
                ax.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest", extent=extent, alpha=0.4)
                ax.imshow(overlay(weights, color, vmax, gh, gw), interpolation="nearest", extent=extent)
            else:
                ax.imshow(overlay(weights, color, vmax, gh, gw), interpolation="nearest")
            ax.set_title(label if has_pixels else f"{name}: {label}", fontsize=10, color=color)
            col += 1
        for ax in axes[r]:
            ax.set_xticks([])
            ax.set_yticks([])
    layers = list(dict.fromkeys(str(e["layer"]) for e in entries if e.get("layer") is not None))
    where = f"layer {', '.join(layers)}, " if layers else ""
    fig.suptitle(f"Attention from [CLS] to each patch ({where}mean over heads)\nopacity ∝ weight, one scale per row",
                 fontsize=10.5)
    fig.tight_layout(h_pad=1.5)
    return fig


_FIGURES = (("curves.png", _curves_figure), ("per_layer_kl.png", _per_layer_figure),
            ("luna_channels.png", _luna_figure), ("cls_attention.png", _cls_figure))


def make_figures(report, run_dir):
    """Draw the figures whose data exist into ``run_dir/figures/``; return their paths relative to
    ``run_dir`` (``["figures/curves.png", ...]``). A figure whose data vanished is removed, so the
    folder always matches the report."""
    run_dir = Path(run_dir)
    written = []
    for name, draw in _FIGURES:
        path = run_dir / FIGURES_DIR / name
        fig = draw(report)
        if fig is None:
            path.unlink(missing_ok=True)
            continue
        _save_figure(fig, path)
        written.append(f"{FIGURES_DIR}/{name}")
    return written


# ---------------------------------------------------------------- writing

def write_report(report, run_dir):
    """Write ``report.json``, ``figures/*.png`` and ``report.md`` into ``run_dir`` (each atomically).

    Sets ``report["figures"]`` to the figures drawn. Returns the paths written.
    """
    validate_report(report)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    plain = _plain(report)
    figures = make_figures(plain, run_dir)
    report["figures"] = plain["figures"] = figures
    atomic_write_json(run_dir / REPORT_JSON, plain)
    atomic_write_text(run_dir / REPORT_MD, render_markdown(plain))
    return [run_dir / REPORT_JSON, run_dir / REPORT_MD] + [run_dir / f for f in figures]


def render_report(run_dir):
    """Re-render ``report.md`` and the figures of ``run_dir`` (or of the given ``report.json``)."""
    path = Path(run_dir)
    report = load_report(path)
    return write_report(report, path.parent if path.is_file() else path)
