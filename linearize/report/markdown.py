"""``report.md``: a :class:`~linearize.report.results.Report` rendered as markdown.

The headline number is LUNA's (Table 2): the student's score as a percentage of the fine-tuned
softmax teacher's, per metric and averaged. On near bag-of-words tasks accuracy separates
methods weakly, so the per-layer stage-1 attention distances sit right under the scores, with
the worst-distilled layer called out. Sections whose data are absent are left out.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

from ..machine import busy_warning
from ..markdown import markdown_table
from .results import REPORT_JSON, STAGES, ModelInfo, TaskInfo, as_report, finite, mean, plain

CAPTIONS = {
    "curves.png": "Training curves: stage-1 attention distillation (CE and KL to the teacher's attention) "
                  "and task training of the teacher and the student (train loss, dev metric).",
    "per_layer_kl.png": "Per-layer KL between the teacher's softmax attention and the student's linear "
                        "attention, before and after stage 1, and the attention entropies.",
    "luna_channels.png": "LUNA's learned channels ψ_ℓ(u) (lines) over the empirical distribution of "
                         "u = wᵢᵀx + bᵢ (gray histogram), as in LUNA Fig. 3.",
    "cls_attention.png": "Attention from [CLS]: softmax teacher (red) vs linear student (blue), as in LUNA Fig. 4.",
}


# ---------------------------------------------------------------- formatting

def _or_dash(format_number):
    """``format_number`` applied to a finite number; "—" for a missing (or non-finite) one."""
    @functools.wraps(format_number)
    def format_value(value, *args, **kwargs):
        value = finite(value)
        return "—" if value is None else format_number(value, *args, **kwargs)

    return format_value


@_or_dash
def _fmt_score(value):
    return f"{value:.3f}" if abs(value) <= 1.5 else f"{value:.2f}"


@_or_dash
def _fmt_pct(value, bold=False):
    return f"**{value:.1f}%**" if bold else f"{value:.1f}%"


@_or_dash
def _fmt_small_pct(value):
    """A percentage that may be tiny (parameter overhead): three significant digits."""
    return f"{value:.3g}%" if value < 100 else f"{value:.1f}%"


@_or_dash
def _fmt_loss(value):
    return f"{value:.3f}"


@_or_dash
def _fmt_count(value):
    return f"{int(round(value)):,}"


@_or_dash
def _fmt_seconds(value):
    if value < 90:
        return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"
    return f"{value / 60:.1f} min" if value < 90 * 60 else f"{value / 3600:.2f} h"


@_or_dash
def _fmt_ms(value):
    return f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms"


def _md_escape(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


# ---------------------------------------------------------------- the document

def render_markdown(report):
    """``report.md`` as a string (``report``: a :class:`Report`, or ``report.json``'s content)."""
    report = as_report(report)
    recipe = report.recipe
    source = report.model.source or recipe.get("model") or "model"
    method = report.model.method or recipe.get("method") or "linear attention"
    task_name = report.task.name or recipe.get("task") or "task"
    out = [f"# {source} → {method} on {task_name}", ""]
    meta = []
    if recipe.get("name"):
        meta.append(f"recipe `{recipe['name']}`")
    if report.created:
        meta.append(f"created {report.created}")
    seed = (report.seeds or {}).get("seed", recipe.get("seed"))
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
    lines = _embedding_lines(report) if report.task.embedding else _recovery_lines(report)
    attention = report.attention
    before, after = attention.mean_kl_before, attention.mean_kl_after
    worst, key = attention.worst_layer()
    over = (f"mean over the {len(attention.converted_rows)} layers still converted" if attention.softmax_kept
            else "mean over layers")
    if attention.stage1_skipped and before is not None:
        text = f"Stage 1 was skipped; attention KL to the teacher, {over}: {before:.3f}"
    elif before is not None and after is not None:
        text = f"Attention KL to the teacher, {over}: {before:.3f} → {after:.3f} through stage 1"
    elif before is not None or after is not None:
        text = f"Attention KL to the teacher, {over}: {(before if before is not None else after):.3f}"
    else:
        text = None
    if text:
        if worst is not None and key.startswith("kl"):
            text += f"; layer {worst.layer} lags most ({getattr(worst, key):.3f})"
        lines += ["", text + "." + _softmax_kept_sentence(attention)]
    return lines


def _softmax_kept_sentence(attention):
    """`` Given back softmax attention after stage 1 ...: layer 1 (KL 0.259).`` when ``stage1.keep_softmax`` gave
    any layer back softmax, else ``""``."""
    kept = [row for row in attention.per_layer if row.layer in attention.softmax_kept]
    if not kept:
        return ""
    layers = ", ".join(f"{row.layer} (KL {row.kl_after:.3f})" if row.kl_after is not None else str(row.layer)
                       for row in kept)
    return (f" Given back softmax attention after stage 1 (stage1.keep_softmax), the highest KL: layer"
            f"{'s' if len(kept) > 1 else ''} {layers}.")


def _recovery_lines(report):
    """The summary's recovery sentence."""
    split, names = report.split, report.metric_names
    student = report.recovery("student")
    lines = []
    if student.average is not None:
        if len(student.per_metric) == 1 or len(names) == 1:
            metric = next(iter(student.per_metric), names[0] if names else "score")
            teacher_score = report.scores_of("teacher").get(metric)
            student_score = report.scores_of("student").get(metric)
            detail = ""
            if finite(teacher_score) is not None and finite(student_score) is not None:
                detail = f" (student {_fmt_score(student_score)}, teacher {_fmt_score(teacher_score)})"
            lines.append(f"**The linear student keeps {_fmt_pct(student.average)} of the teacher's {metric} on the "
                         f"{split} split**{detail}.")
        else:
            parts = ", ".join(f"{k} {_fmt_pct(v)}" for k, v in student.per_metric.items())
            lines.append(f"**The linear student keeps {_fmt_pct(student.average)} of the teacher's score on the "
                         f"{split} split** (average over metrics: {parts}).")
        stage1_average = report.recovery("student_stage1").average
        if stage1_average is not None:
            lines[-1] += f" After stage 1 alone, before fine-tuning, it kept {_fmt_pct(stage1_average)}."
        if report.selection.stage1_kept:
            lines[-1] += (f" No stage-2 epoch beat that model on the {report.task.selection_split or 'selection'} "
                          "split, so it is the saved student.")
    else:
        lines.append(f"No student score on the {split} split was recorded, so the recovery is unknown.")
    warning = report.chance_warning()
    if warning:
        lines += ["", f"**Warning: {warning}.**"]
    return lines


def _embedding_lines(report):
    """The summary of an embedding task: agreement with the teacher's embeddings, mean cosine first
    (the score: the recovery is it × 100, the teacher's agreement with itself being 1)."""
    split = report.split
    student, teacher, stage1 = (report.scores_of(stage) for stage in ("student", "teacher", "student_stage1"))
    cosine = finite(student.get("cosine"))
    if cosine is None:
        return [f"No student score on the {split} split was recorded, so the agreement is unknown."]
    line = (f"**The linear student's sentence embeddings agree with the teacher's: mean cosine {cosine:.3f} on the "
            f"held-out {split} sentences** (the score: recovery {_fmt_pct(100 * cosine)})")
    if finite(student.get("top10_overlap")) is not None:
        line += f"; top-10 retrieval overlap {student['top10_overlap']:.3f}"
    if finite(student.get("sts_spearman")) is not None:
        line += (f"; Spearman correlation with the similarity set's scores {student['sts_spearman']:.3f} "
                 f"(teacher {_fmt_score(teacher.get('sts_spearman'))})")
    line += "."
    if finite(student.get("doc_cosine")) is not None:
        length = (report.recipe.get("data") or {}).get("document_length")
        line += (f" On whole documents{f' cut at {length:,} tokens' if length else ''} (held-out movie reviews): "
                 f"mean cosine {student['doc_cosine']:.3f}, top-10 overlap "
                 f"{_fmt_score(student.get('doc_top10_overlap'))}.")
    if finite(stage1.get("cosine")) is not None:
        line += f" After stage 1 alone the mean cosine was {stage1['cosine']:.3f}."
    return [line]


def _scores_section(report):
    task, split, names = report.task, report.split, report.metric_names
    selection = task.selection_split

    def scores(stage, on):
        return report.scores_of(stage, on) if on else {}

    final = "final student (the stage-1 model, kept on dev)" if report.selection.stage1_kept else \
        "student after stage 2"
    labels = zip(STAGES, ("teacher (softmax)", "student after stage 1", final))
    stages = [(key, label) for key, label in labels if key == "teacher" or scores(key, split) or scores(key, selection)]
    if not names:
        return []
    lines = ["## Scores", ""]
    multi = len(names) > 1
    total = f"recovery ({report.primary_metric})" if report.task.embedding else "recovery (average)"
    header = ["model"] + [f"{name} ({split})" for name in names] + [total if multi else "recovery"]
    rows = []
    for key, label in stages:
        on_split = scores(key, split)
        if key == "teacher":
            per_metric = {n: 100.0 for n in names if finite(on_split.get(n)) is not None}
            average = 100.0 if on_split else None
        else:
            rec = report.recovery(key)
            per_metric, average = rec.per_metric, rec.average
        cells = []
        for name in names:
            cell = _fmt_score(on_split.get(name))
            if multi and key != "teacher" and finite(per_metric.get(name)) is not None:
                cell += f" ({_fmt_pct(per_metric[name])})"
            cells.append(cell)
        rows.append([label] + cells + [_fmt_pct(average, bold=(key == "student"))])
    lines.append(markdown_table(header, rows))
    lines += ["", f"Recovery = student ÷ teacher × 100 on the {split} split (LUNA Table 2)."]
    if report.task.embedding:
        lines[-1] += (" An embedding task has no labels: the teacher's embeddings are the reference, so its own "
                      "cosine and overlap are 1; cosine is the mean cosine between teacher and student embeddings of "
                      "each sentence, top10_overlap the mean share of each sentence's 10 nearest neighbours (in "
                      "the split's sentences) both find, sts_spearman (with a similarity file) the rank correlation "
                      "of cosine similarities with its scores.")
    if selection and selection != split:
        sel_rows = [[label] + [_fmt_score(scores(key, selection).get(name)) for name in names]
                    for key, label in stages if scores(key, selection)]
        if sel_rows:
            lines += ["", f"On the {selection} split (used for model selection and early stopping):", "",
                      markdown_table(["model"] + [f"{name} ({selection})" for name in names], sel_rows)]
    note = selection_note(report)
    return lines + (["", note] if note else []) + _noise_note(report) + _task_note(report)


def selection_note(report):
    """One sentence on the candidate stage 2 kept on the selection split and their dev scores (the
    stage-1 model is epoch 0), or None when the report records no selection."""
    chosen = report.selection
    if not chosen.candidates or chosen.selected_epoch is None:
        return None
    scores = "; ".join(f"{'the stage-1 model' if epoch == 0 else f'epoch {epoch}'} {_fmt_score(score)}"
                       for epoch, score in chosen.candidates)
    by_epoch, margin = dict(chosen.candidates), chosen.margin or 0.0
    initial, selected = by_epoch.get(0), by_epoch.get(chosen.selected_epoch)
    if chosen.stage1_kept:
        kept = "Stage 2 kept the stage-1 model (epoch 0): none of its own epochs beat it"
        kept += f", and it led each by at least the margin, {_fmt_score(margin)}" * bool(margin)
    elif initial is not None and selected is not None and selected <= initial:
        kept = (f"Stage 2 kept its epoch {chosen.selected_epoch}: the stage-1 model led it by "
                f"{_fmt_score(initial - selected)}, under the margin of {_fmt_score(margin)}")
    else:
        beat = ", which beat the stage-1 model" if initial is not None else ""
        kept = f"Stage 2 kept its epoch {chosen.selected_epoch}{beat}"
    split, metric = report.task.selection_split or "selection", chosen.metric or report.primary_metric
    rule = (f"the stage-1 model is kept only when ahead by at least the margin, stage2.stage1_margin standard errors "
            f"of its dev {metric}") if margin else "a tie keeps the earlier model"
    return f"{kept} on the {split} split ({metric}: {scores}; {rule})."


def _noise_note(report):
    """A noise yardstick for accuracies: a difference smaller than ~2 standard errors is not one."""
    split = report.split
    n = finite(report.task.num_examples.get(split))
    teacher_acc = finite(report.scores_of("teacher").get("accuracy"))
    if not (n and n > 0 and teacher_acc is not None and 0 <= teacher_acc <= 1):
        return []
    se = math.sqrt(teacher_acc * (1 - teacher_acc) / n)
    return ["", f"With {int(n):,} {split} examples one standard error of the accuracy is about "
                f"{100 * se:.1f} points ({100 * se / teacher_acc:.1f} recovery points): compare runs over "
                "several seeds before trusting small differences."]


def _task_note(report):
    task = report.task
    if task == TaskInfo():
        return []
    facts = [f"{task.kind} task"] if task.kind else []
    facts.append(f"primary metric {report.primary_metric}")
    if task.num_examples:
        facts.append("examples: " + ", ".join(f"{k} {_fmt_count(v)}" for k, v in task.num_examples.items()))
    return ["", "Task: " + "; ".join(facts) + "."]


def _model_section(report):
    model = report.model
    if model == ModelInfo():
        return []
    rows = [(label, f"`{value}`") for label, value in (("architecture", model.architecture),
                                                        ("source", model.source), ("method", model.method)) if value]
    if model.options is not None:
        rows.append(("options", ", ".join(f"{k}={v}" for k, v in model.options.items()) or "defaults"))
    layers, total = model.layers, model.num_attention_layers
    if layers is not None:
        text = f"{len(layers)}" + (f" of {total}" if total is not None else "") + f": {layers}"
        if total is not None and len(layers) != total:
            text += " (the others stay softmax)"
        rows.append(("converted layers", text))
    if model.window or model.sinks:
        from ..attention.hybrid import describe

        rows.append(("attention", describe(model.method, model.window or 0, model.sinks or (), model.hybrid_layers)))
    if model.parameters_added is not None:
        text = f"{_fmt_count(model.parameters_added)}"
        if model.parameters_added_percent is not None:
            text += f" ({_fmt_small_pct(model.parameters_added_percent)}"
            text += f" of {_fmt_count(model.parameters_base)})" if model.parameters_base else ")"
        rows.append(("parameters added", text))
    elif model.parameters_base is not None:
        rows.append(("parameters", _fmt_count(model.parameters_base)))
    if not rows:
        return []
    return ["## Model", "", markdown_table(["", ""], [(f"**{k}**", _md_escape(v)) for k, v in rows], ["left", "left"])]


def _attention_section(report):
    attention = report.attention
    rows = attention.per_layer
    if not rows:
        return []
    skipped = attention.stage1_skipped
    lines = ["## Attention distillation per layer", ""]
    if skipped:
        lines += ["Stage 1 was skipped (by the recipe, or because the method learns nothing in its feature maps): "
                  "these are the distances of the untrained conversion.", ""]
    columns = [key for key in ("ce", "kl") if any(getattr(r, f"{key}_before") is not None
                                                   or getattr(r, f"{key}_after") is not None for r in rows)]
    has_entropy = any(r.teacher_entropy is not None or r.student_entropy is not None for r in rows)
    worst, _ = attention.worst_layer()
    header = ["layer"] + [f"{key.upper()} (untrained)" if skipped else f"{key.upper()} before → after"
                          for key in columns]
    if has_entropy:
        header += ["teacher entropy", "student entropy", "gap"]
    table_rows = [_layer_cells(row, columns, skipped, has_entropy, row is worst, row.layer in attention.softmax_kept)
                  for row in rows]
    if any(cells[-1] for cells in table_rows):
        header.append("")
    else:
        table_rows = [cells[:-1] for cells in table_rows]
    lines.append(markdown_table(header, table_rows))
    return lines + ["", " ".join(_attention_notes(attention, has_entropy))]


def _layer_cells(row, columns, skipped, has_entropy, is_worst, softmax_kept=False):
    cells = ["?" if row.layer is None else str(row.layer)]
    for key in columns:
        before, after = getattr(row, f"{key}_before"), getattr(row, f"{key}_after")
        cells.append(_fmt_loss(before) if skipped or after is None else f"{_fmt_loss(before)} → {_fmt_loss(after)}")
    if has_entropy:
        t, s = row.teacher_entropy, row.student_entropy
        cells += [_fmt_loss(t), _fmt_loss(s), f"{s - t:+.3f}" if t is not None and s is not None else "—"]
    if is_worst:  # bold the layer and its distances (not the entropies)
        cells[: 1 + len(columns)] = [f"**{c}**" if c != "—" else c for c in cells[: 1 + len(columns)]]
    return cells + ["◀ worst" if is_worst else "softmax kept" if softmax_kept else ""]


def _attention_notes(attention, has_entropy):
    notes = ["CE: cross-entropy of the student's attention rows against the teacher's; KL = CE − teacher "
             "entropy (0 = identical attention), in nats, averaged over heads and query rows."]
    if has_entropy:
        notes.append("A positive entropy gap means the student attends more diffusely than the teacher.")
    before, after, skipped = attention.mean_kl_before, attention.mean_kl_after, attention.stage1_skipped
    if attention.softmax_kept:
        notes.append(_softmax_kept_sentence(attention).strip() + " The means below cover the layers still converted.")
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
    worst, key = attention.worst_layer()
    if worst is not None and len(attention.converted_rows) > 1:
        others = mean(getattr(r, key) for r in attention.converted_rows if r is not worst)
        if others is not None:
            what = {"kl_after": "KL after stage 1", "ce_after": "CE after stage 1", "kl_before": "KL",
                    "ce_before": "CE"}[key]
            lever = "running stage 1" if skipped else "a longer or stronger stage 1"
            notes.append(f"Layer {worst.layer} lags most ({what} {getattr(worst, key):.3f}, vs {others:.3f} on "
                         f"average in the other layers): {lever}, or keeping that layer softmax, are the levers "
                         "to try.")
    return notes


def _timing_section(report):
    timing = report.timing
    stages = [("teacher fine-tuning (softmax)", timing.teacher_seconds),
              ("stage 1: attention distillation", timing.stage1_seconds),
              ("stage 2: task fine-tuning", timing.stage2_seconds)]
    rows = [(label, seconds) for label, seconds in stages if seconds is not None]
    total = timing.total_seconds
    if not rows and total is None:
        return []
    table_rows = [[label, _fmt_seconds(seconds), f"{100 * seconds / total:.0f}%" if total else "—"]
                  for label, seconds in rows]
    if total is not None:
        table_rows.append(["**total**", f"**{_fmt_seconds(total)}**", "100%"])
    return ["## Time", "", markdown_table(["stage", "wall time", "share"], table_rows)]


#: where a run's timings come from, and how to get the figure a user's own process sees
IN_PROCESS_NOTE = ("Timed in the `linearize` process: the models warm in memory, with the malloc settings the "
                   "command applies; a user's own process (plain transformers, glibc's default allocator) gets less. "
                   "`linearize bench folder DIR --processes 5` times the saved folder as a user loads it.")


def _latency_section(report):
    latency = report.latency
    if latency.teacher_ms is None and latency.student_ms is None:
        return []
    shape = []
    if latency.batch_size is not None:
        shape.append(f"batch {latency.batch_size}")
    if latency.seq_len is not None:
        shape.append(f"sequence length {latency.seq_len}")
    rows = [["teacher (softmax attention)", _fmt_ms(latency.teacher_ms)],
            ["student (linear attention)", _fmt_ms(latency.student_ms)]]
    if latency.speedup is not None:
        rows.append(["speedup", f"**{latency.speedup:.2f}×**" + (" (slower)" if latency.speedup < 1 else "")])
    lines = ["## Inference latency", "",
             markdown_table(["forward pass" + (f" ({', '.join(shape)})" if shape else ""), "time"], rows)]
    if latency.at_lengths:
        lines += ["", "At longer inputs (batch 1; a model with fewer learned positions timed with its table tiled):", "",
                  markdown_table(["tokens", "teacher (softmax)", "student", "speed-up"],
                                 [[f"{row.seq_len:,}", _fmt_ms(row.teacher_ms), _fmt_ms(row.student_ms),
                                   "–" if row.speedup is None else f"**{row.speedup:.2f}×**"]
                                  for row in latency.at_lengths], align=["---:"] * 4)]
    own = latency.own_lengths
    if own is not None and own.teacher_ms is not None and own.student_ms is not None:
        lines += ["", f"At the task's own lengths: {own.examples:,} examples of the report's split, each with its real "
                      f"tokens only ({own.mean_tokens:,.0f} on average), batch 1, the models alternating; mean time per "
                      "example:", "",
                  markdown_table(["per example", "time"],
                                 [["teacher (softmax attention)", _fmt_ms(own.teacher_ms)],
                                  ["student (linear attention)", _fmt_ms(own.student_ms)],
                                  ["speed-up", "–" if own.speedup is None else f"**{own.speedup:.2f}×**"
                                   + (" (slower)" if own.speedup < 1 else "")]])]
    busy = busy_warning(latency.busy_cores())
    if busy:  # on a busy machine the linear paths' many small operations lose the most
        lines += ["", f"**Warning: {busy}** (`linearize bench` on the saved folder measures it again)."]
    return lines + ["", "Linear attention's advantage grows with sequence length; at short lengths the feature map's "
                        "overhead can outweigh it.", "", IN_PROCESS_NOTE]


def _figures_section(report):
    if not report.figures:
        return []
    lines = ["## Figures", ""]
    for figure in report.figures:
        name = Path(figure).name
        lines += [f"![{Path(name).stem.replace('_', ' ')}]({figure})", "", f"*{CAPTIONS.get(name, name)}*", ""]
    return lines[:-1]


def _reproducibility_section(report):
    lines = ["## Reproducibility", ""]
    if report.recipe:
        import yaml

        text = yaml.safe_dump(plain(report.recipe), sort_keys=False, default_flow_style=False, allow_unicode=True,
                              width=100).rstrip()
        lines += ["The resolved recipe:", "", "```yaml", text, "```", ""]
    facts = []
    if report.seeds:
        facts.append(("seeds", ", ".join(f"{k}={v}" for k, v in report.seeds.items())))
    if report.data_hash:
        facts.append(("data hash", f"`{report.data_hash}`"))
    for key, value in (report.environment or {}).items():
        if value is not None:
            facts.append((key, f"`{value}`" if key in ("python", "torch", "transformers", "linearize") else str(value)))
    if report.created:
        facts.append(("created", str(report.created)))
    if facts:
        lines.append(markdown_table(["", ""], [(f"**{k}**", _md_escape(v)) for k, v in facts], ["left", "left"]))
    lines += ["", f"`linearize report RUN_DIR` re-renders this file and the figures from `{REPORT_JSON}`."]
    return lines
