"""The run's :class:`~linearize.report.Report`, assembled once from the stages' results and the
measurements, and written into the run folder (and a copy into ``model/``)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from ..convert import conversion_record
from ..report import (AttentionInfo, LayerDistance, Latency, ModelInfo, Report, TaskInfo, Timing, copy_report,
                      save_report)
from .artifacts import comparable
from ..machine import environment
from .measurements import data_hash


def build_report(config, task, student, results, report_split, timing, seq_len, batch, visuals, total_seconds):
    """The run's :class:`~linearize.report.Report`, built once: the report files, ``linearize
    push``'s model card and ``linearize compare``'s table all read this object. ``config``: the
    run's :class:`~linearize.config.RunConfig`; ``task``: its ``TaskData``; ``results``: the
    :class:`~linearize.report.StageResult` of the teacher, stage 1 and stage 2."""
    teacher, stage1, stage2 = results
    spec, data = task.spec, task.data
    return Report(
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), recipe=comparable(config.to_recipe()),
        task=TaskInfo(name=spec.name, kind=spec.kind, metric_names=tuple(spec.metric_names),
                      primary_metric=spec.primary_metric, selection_split="validation", report_split=report_split,
                      num_examples={split: len(ds) for split, ds in data.items()},
                      embedding=spec.is_embedding or None,
                      num_labels=None if spec.is_embedding else spec.num_labels),
        model=_model_info(config.model, student),
        scores={"teacher": teacher.scores, "student_stage1": stage1.scores, "student": stage2.scores},
        attention=_attention(stage1, student),
        timing=Timing(teacher_seconds=teacher.seconds, stage1_seconds=stage1.seconds, stage2_seconds=stage2.seconds,
                      total_seconds=total_seconds),
        latency=Latency.from_json({**timing, "seq_len": seq_len, "batch_size": int(next(iter(batch.values())).shape[0])}),
        selection=stage2.selection(spec.primary_metric),
        curves={"teacher": teacher.history, "stage1": stage1.history, "stage2": stage2.history}, visuals=visuals,
        seeds={"seed": config.seed, "data_seed": config.data.seed}, environment=environment(),
        data_hash=data_hash(data))


def _model_info(source, student):
    """The student's source, method and parameter counts, from its conversion record."""
    source = str(source) if not isinstance(source, dict) else "from scratch"
    record = conversion_record(student)
    if record is None:
        return ModelInfo(source=source, options={}, parameters_base=0, parameters_added=0,
                         parameters_added_percent=0.0)
    return ModelInfo(source=source, architecture=record.architecture, method=record.method,
                     options=dict(record.options), layers=list(record.layers),
                     num_attention_layers=record.num_attention_layers, parameters_base=record.parameters_base or 0,
                     parameters_added=record.parameters_added, parameters_added_percent=record.parameters_added_percent,
                     window=record.window, sinks=list(record.sinks),
                     hybrid_layers=None if record.hybrid_layers is None else list(record.hybrid_layers))


def _attention(stage1, student):
    """Stage 1's attention distances per layer, before and after, and their means over the layers still
    converted (``stage1.keep_softmax`` gives some back softmax after stage 1: named in ``softmax_kept``)."""
    before, after = stage1.per_layer_before, stage1.per_layer_after
    record = conversion_record(student)
    converted = set(record.layers) if record is not None else {int(layer) for layer in after}
    rows = tuple(LayerDistance(layer=int(layer), ce_before=before.get(layer, {}).get("ce"),
                               kl_before=before.get(layer, {}).get("kl"), ce_after=after[layer]["ce"],
                               kl_after=after[layer]["kl"], teacher_entropy=after[layer]["teacher_entropy"],
                               student_entropy=after[layer]["student_entropy"]) for layer in sorted(after, key=int))
    return AttentionInfo.from_rows(rows, stage1_skipped=stage1.skipped,
                                   softmax_kept=[row.layer for row in rows if row.layer not in converted])


def write_run_report(report, out_dir):
    """report.json, report.md and figures in the run folder (drawn once), and a copy of them inside
    ``model/`` (what ``linearize push`` of the model folder uploads). Returns the report with its figures."""
    report = save_report(report, out_dir)
    copy_report(out_dir, Path(out_dir) / "model")
    return report
