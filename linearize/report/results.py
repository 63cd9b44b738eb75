"""Typed results: what a training stage returns (:class:`StageResult`) and a run's report
(:class:`Report`, written as ``report.json``).

The report is built once (``pipeline.build_report``) and read by everything else — the markdown
(:mod:`.markdown`), the figures (:mod:`.figures`), the Hub model card (:mod:`.card`) and
``linearize compare`` — through its fields and methods; none of them reads the JSON.

Recovery (LUNA Table 2: the student's score as a percentage of the fine-tuned softmax
teacher's, per metric and averaged) is computed by :func:`recovery` and nowhere else; the
report derives it from its scores (:meth:`Report.recovery`) and writes it into ``report.json``
for readers of the file.

``report.json`` (``schema`` ``"linearize.report"``, ``schema_version`` 1)::

    {
     "schema": "linearize.report", "schema_version": 1, "created": "2026-11-22T07:00:00Z",
     "recipe": {...},            # the full resolved recipe (shown as YAML)
     "task": {"name": "moviereviews", "kind": "text" | "image", "metric_names": ["accuracy"],
              "primary_metric": "accuracy", "selection_split": "validation", "report_split": "test",
              "num_examples": {"train": 2880, "validation": 320, "test": 800},
              "embedding": true,         # (embedding tasks only) metrics: cosine, top10_overlap, sts_spearman
              "num_labels": 2},          # the head's classes (1: regression; absent: an embedding task)
     "model": {"source": "minilm", "architecture": "BertForSequenceClassification", "method": "luna",
               "options": {}, "layers": [0, 1, 2, 3, 4, 5], "num_attention_layers": 6,
               "parameters_base": 22713986, "parameters_added": 5472, "parameters_added_percent": 0.024},
     "scores": {"teacher":        {"validation": {"accuracy": 0.81}, "test": {"accuracy": 0.815}},
                "student_stage1": {"validation": {...}, "test": {...}},   # after stage 1, before fine-tuning
                "student":        {"validation": {...}, "test": {...}}},  # after stage 2
     "recovery": {"split": "test", "per_metric": {"accuracy": 98.2}, "average": 98.2,
                  "stage1_per_metric": {...}, "stage1_average": 91.0},    # derived from the scores
     "attention": {"per_layer": [{"layer": 0, "ce_before": 3.1, "kl_before": 1.1, "ce_after": 2.5,
                                  "kl_after": 0.6, "teacher_entropy": 2.0, "student_entropy": 2.2}, ...],
                   "mean_kl_before": 1.1, "mean_kl_after": 0.7, "stage1_skipped": false},
     "timing": {"teacher_seconds": 250.0, "stage1_seconds": 60.0, "stage2_seconds": 300.0,
                "total_seconds": 640.0},
     "latency": {"seq_len": 64, "batch_size": 32, "teacher_ms": 40.1, "student_ms": 38.0, "speedup": 1.05,
                 "at_lengths": [{"seq_len": 2048, "teacher_ms": 590.0, "student_ms": 380.0, "speedup": 1.55},
                                ...],  # batch 1 at eval.latency_lengths beyond the run's own length
                 "own_lengths": {"examples": 100, "mean_tokens": 851.2, "teacher_ms": 133.2, "student_ms": 110.0,
                                 "speedup": 1.21}},  # mean per example at its own length (eval.latency_examples)
     "selection": {"metric": "accuracy",     # stage 2's model selection on the selection split
                   "candidates": [{"epoch": 0, "score": 0.806},   # epoch 0: the stage-1 model
                                  {"epoch": 1, "score": 0.794}],  # then stage 2's epochs
                   "selected_epoch": 0},     # the saved student (0: the stage-1 model)
     "curves": {"teacher": [{"epoch": 1, "step": 100, "train_loss": 0.5, "lr": 1e-5, "dev_accuracy": 0.8}, ...],
                "stage1":  [{"step": 1, "ce": 3.1, "kl": 1.1, "lr": 1e-3}, ...],
                "stage2":  [...]},
     "visuals": {
        "luna_channels": [      # a feature map's probe() (LUNA Fig. 3): first and last converted layer
            {"layer": 0, "grid": [...],          # ~200 values of u = w_i^T x + b_i over its empirical range
             "psi": [[...], ...],                # len(grid) x L: the L channels psi_l(u) at each grid point
             "hist_edges": [...], "hist_counts": [...]}],
        "cls_attention": [      # LUNA Fig. 4: attention from [CLS], one layer, mean over heads
            {"text": "a gripping film", "tokens": ["[CLS]", ...], "teacher": [...], "student": [...], "layer": 5},
            {"image_index": 3, "grid": [7, 7], "teacher": [...49], "student": [...49], "layer": 5,
             "pixels": [[...]]}]},                # (image tasks) optional H x W grayscale 0-255
     "seeds": {"seed": 0}, "environment": {"python": ..., "torch": ...}, "data_hash": "sha256:...",
     "figures": ["figures/curves.png", ...]      # the figures drawn (set when the report is written)
    }

Only ``schema``, ``schema_version``, ``recipe``, ``task``, ``model`` and ``scores`` are required
(:data:`REQUIRED_SECTIONS`); any other section or key may be missing or ``null``, and the
renderers leave that part out. :meth:`Report.from_json` reads the layouts that earlier
linearize versions wrote (see :func:`_normalise_v1`); :meth:`Report.to_json` writes the current one.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..errors import LinearizeError

SCHEMA = "linearize.report"
SCHEMA_VERSION = 1
REQUIRED_SECTIONS = ("recipe", "task", "model", "scores")
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
FIGURES_DIR = "figures"
FIGURE_NAMES = ("curves.png", "per_layer_kl.png", "luna_channels.png", "cls_attention.png")
#: a teacher whose primary score is no more than this above chance has learnt nothing measurable
CHANCE_MARGIN = 0.02
#: the score of a guess, for the metrics where it does not depend on the data: a correlation's is 0
CORRELATION_METRICS = ("matthews_correlation", "pearson", "spearmanr", "combined")
#: the score entries of a report, in table order: teacher, student after stage 1, after stage 2
STAGES = ("teacher", "student_stage1", "student")


def finite(value):
    """``value`` as a finite float, or None (missing, boolean, text, NaN or infinite)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def mean(values):
    """The mean of the finite numbers in ``values``, or None."""
    values = [v for v in (finite(x) for x in values) if v is not None]
    return sum(values) / len(values) if values else None


def plain(value):
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


def recovery(teacher, student):
    """``(per_metric, average)``: the student's score ÷ the teacher's × 100 for every metric both
    have (a zero teacher score has no ratio), and their mean; ``average`` is None when no metric
    has one (LUNA, Table 2: "recovery" of the fine-tuned softmax model's score)."""
    import numpy as np

    teacher, student = teacher or {}, student or {}
    per_metric = {k: 100.0 * student[k] / teacher[k] for k in teacher
                  if finite(student.get(k)) is not None and finite(teacher[k])}
    average = float(np.mean(list(per_metric.values()))) if per_metric else None
    return per_metric, average


# ---------------------------------------------------------------- a stage's result

@dataclass(frozen=True)
class StageResult:
    """What a training stage (the teacher's fine-tuning, stage 1, stage 2) produced: what
    ``distill`` and ``finetune`` return, what ``state.json`` keeps, what the report reads.

    ``scores``: ``{split: {metric: value}}`` of the model after the stage; ``history``: its
    training curve (one dict per logged step or epoch); ``per_layer_before``/``_after``: stage
    1's attention distances ``{layer: {"ce", "kl", "teacher_entropy", "student_entropy"}}``;
    ``steps``: optimizer steps taken; ``best_epoch`` / ``best_metric`` / ``initial_metric``: a
    fine-tuning's selection (epoch 0: the model it started from, whose dev score is
    ``initial_metric`` when it competed); ``reason``: why a skipped stage was skipped;
    ``finetuned``: the teacher was fine-tuned (False: taken as it is); ``extra``: everything
    else the stage reported (``config``, ``dev_metrics``, ``epochs_run``, ...).
    """

    seconds: float = 0.0
    history: list = field(default_factory=list)
    scores: dict = field(default_factory=dict)
    skipped: bool = False
    per_layer_before: dict = field(default_factory=dict)
    per_layer_after: dict = field(default_factory=dict)
    steps: int | None = None
    method: str | None = None
    best_epoch: int | None = None
    best_metric: float | None = None
    initial_metric: float | None = None
    reason: str | None = None
    finetuned: bool | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data):
        """From the flat dict :meth:`to_dict` writes (``state.json``, ``distill.json``)."""
        if isinstance(data, cls):
            return data
        data = dict(data or {})
        known = {f.name: data.pop(f.name) for f in dataclasses.fields(cls) if f.name != "extra" and f.name in data}
        known["seconds"] = finite(known.get("seconds")) or 0.0
        for name in ("history", "scores", "per_layer_before", "per_layer_after"):
            if known.get(name) is None:
                known.pop(name, None)
        return cls(**known, extra=data)

    def to_dict(self):
        """The flat dict (``state.json``'s form): ``extra``'s keys beside the fields that are set."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**self.extra, **{k: v for k, v in fields.items() if v is not None}}

    def with_scores(self, scores):
        return dataclasses.replace(self, scores=scores)

    def selection(self, metric):
        """The :class:`Selection` this fine-tuning stage made on the dev ``metric``: its epochs'
        dev scores (``history``), the model it started from as epoch 0 when that competed
        (``initial_metric``), and its ``best_epoch``; empty when it was skipped or logged no epoch."""
        key = f"dev_{metric}"
        epochs = [(int(e["epoch"]), finite(e.get(key))) for e in self.history
                  if isinstance(e, dict) and "epoch" in e and finite(e.get(key)) is not None]
        if self.skipped or not epochs:
            return Selection()
        initial = finite(self.initial_metric)
        candidates = ([(0, initial)] if initial is not None else []) + epochs
        selected = self.best_epoch
        return Selection(metric=metric, candidates=tuple(candidates),
                         selected_epoch=int(selected) if finite(selected) is not None else None,
                         margin=finite(self.extra.get("stage1_margin")) if initial is not None else None)


# ---------------------------------------------------------------- the report's sections

def _fields(cls, data, numbers=()):
    """The keyword arguments of ``cls`` found in ``data`` (numbers in ``numbers`` made finite)."""
    data = data if isinstance(data, dict) else {}
    out = {f.name: data[f.name] for f in dataclasses.fields(cls) if data.get(f.name) is not None}
    for name in numbers:
        if name in out:
            out[name] = _number(out[name])
    return out


def _number(value):
    """``value`` itself if it is a finite number (an int stays an int), else None."""
    return value if finite(value) is not None and isinstance(value, (int, float)) else None


def _section_json(section):
    """A section dataclass as JSON: its fields, the unset ones left out."""
    return {k: v for k, v in dataclasses.asdict(section).items() if v is not None}


@dataclass(frozen=True)
class TaskInfo:
    name: str | None = None
    kind: str | None = None
    metric_names: tuple = ()
    primary_metric: str | None = None
    selection_split: str | None = None
    report_split: str | None = None
    num_examples: dict = field(default_factory=dict)
    embedding: bool | None = None  #: an embedding task: scores are agreement with the teacher's embeddings
    num_labels: int | None = None  #: the head's outputs: classes (1: a regression); None: unknown or none

    @classmethod
    def from_json(cls, data):
        out = _fields(cls, data)
        out["metric_names"] = tuple(str(n) for n in out.get("metric_names") or ())
        if not isinstance(out.get("num_examples"), dict):
            out.pop("num_examples", None)
        return cls(**out)

    def to_json(self):
        return {**_section_json(self), "metric_names": list(self.metric_names)}


@dataclass(frozen=True)
class ModelInfo:
    source: str | None = None
    architecture: str | None = None
    method: str | None = None
    options: dict | None = None
    layers: list | None = None
    num_attention_layers: int | None = None
    parameters_base: float | None = None
    parameters_added: float | None = None
    parameters_added_percent: float | None = None
    #: hybrid attention: the exact window's radius (0: pure linear attention) and the sink tokens
    window: int | None = None
    sinks: list | None = None
    #: the hybrid layers (None: every converted layer)
    hybrid_layers: list | None = None

    @classmethod
    def from_json(cls, data):
        out = _fields(cls, data, ("parameters_base", "parameters_added", "parameters_added_percent"))
        for name, kind in (("options", dict), ("layers", list), ("sinks", list), ("window", int),
                           ("hybrid_layers", list)):
            if not isinstance(out.get(name), kind):
                out.pop(name, None)
        return cls(**out)

    def to_json(self):
        return _section_json(self)


@dataclass(frozen=True)
class LayerDistance:
    """Stage 1's attention distances of one layer (nats; KL = CE − teacher entropy)."""

    layer: int | str | None = None
    ce_before: float | None = None
    kl_before: float | None = None
    ce_after: float | None = None
    kl_after: float | None = None
    teacher_entropy: float | None = None
    student_entropy: float | None = None

    @classmethod
    def from_json(cls, data):
        numbers = [f.name for f in dataclasses.fields(cls) if f.name != "layer"]
        return cls(**_fields(cls, data, numbers))


@dataclass(frozen=True)
class AttentionInfo:
    """Stage 1's attention distances per layer and their means. ``softmax_kept``: the layers given back
    softmax attention after stage 1 (``stage1.keep_softmax``); their rows stay in ``per_layer`` (what
    stage 1 reached there) and the means and :meth:`worst_layer` cover the layers still converted."""

    per_layer: tuple = ()
    mean_kl_before: float | None = None
    mean_kl_after: float | None = None
    stage1_skipped: bool = False
    softmax_kept: tuple = ()

    @classmethod
    def from_json(cls, data):
        data = data if isinstance(data, dict) else {}
        rows = data.get("per_layer") if isinstance(data.get("per_layer"), list) else []
        per_layer = tuple(LayerDistance.from_json(row) for row in rows if isinstance(row, dict))
        kept = data.get("softmax_kept") if isinstance(data.get("softmax_kept"), list) else []
        kept = tuple(layer for layer in kept if isinstance(layer, int) and not isinstance(layer, bool))
        return cls.from_rows(per_layer, stage1_skipped=bool(data.get("stage1_skipped")), softmax_kept=kept,
                             mean_kl_before=finite(data.get("mean_kl_before")),
                             mean_kl_after=finite(data.get("mean_kl_after")))

    @classmethod
    def from_rows(cls, per_layer, *, stage1_skipped=False, softmax_kept=(), mean_kl_before=None, mean_kl_after=None):
        """The section from its rows; a mean not given is the mean over the layers still converted."""
        info = cls(per_layer=tuple(per_layer), stage1_skipped=stage1_skipped, softmax_kept=tuple(softmax_kept))
        converted = info.converted_rows
        return dataclasses.replace(
            info, mean_kl_before=mean_kl_before if mean_kl_before is not None else mean(r.kl_before for r in converted),
            mean_kl_after=mean_kl_after if mean_kl_after is not None else mean(r.kl_after for r in converted))

    def to_json(self):
        kept = {"softmax_kept": list(self.softmax_kept)} if self.softmax_kept else {}  # absent from older reports
        return {"per_layer": [_section_json(row) for row in self.per_layer], "mean_kl_before": self.mean_kl_before,
                "mean_kl_after": self.mean_kl_after, "stage1_skipped": self.stage1_skipped, **kept}

    @property
    def converted_rows(self):
        """The rows of the layers still converted (not given back softmax after stage 1)."""
        return tuple(row for row in self.per_layer if row.layer not in self.softmax_kept)

    def worst_layer(self):
        """``(row, key)`` of the converted layer whose attention stays furthest from the teacher's, or
        ``(None, None)``: by KL after stage 1 (before it when skipped), else by CE."""
        keys = ("kl_before", "ce_before") if self.stage1_skipped else ("kl_after", "ce_after", "kl_before",
                                                                         "ce_before")
        for key in keys:
            candidates = [row for row in self.converted_rows if getattr(row, key) is not None]
            if candidates:
                return max(candidates, key=lambda row: getattr(row, key)), key
        return None, None


@dataclass(frozen=True)
class Timing:
    teacher_seconds: float | None = None
    stage1_seconds: float | None = None
    stage2_seconds: float | None = None
    total_seconds: float | None = None

    @classmethod
    def from_json(cls, data):
        return cls(**_fields(cls, data, [f.name for f in dataclasses.fields(cls)]))

    def to_json(self):
        return _section_json(self)


@dataclass(frozen=True)
class Latency:
    """Teacher and student forward time at the run's own length (``seq_len``, ``batch_size``), and at the
    longer lengths of ``eval.latency_lengths`` (``at_lengths``: :class:`LengthLatency` rows, batch 1), and the mean
    time per example of the report's split at its own length (``own_lengths``: :class:`OwnLengthLatency`). Each
    timing keeps ``other_processes_cores``: how busy other processes kept the CPU meanwhile (None in reports
    written before it was recorded); :meth:`busy_cores` is the most of them."""

    seq_len: int | None = None
    batch_size: int | None = None
    teacher_ms: float | None = None
    student_ms: float | None = None
    speedup: float | None = None
    repeats: int | None = None
    other_processes_cores: float | None = None
    at_lengths: tuple = ()
    own_lengths: OwnLengthLatency | None = None

    @classmethod
    def from_json(cls, data):
        out = _fields(cls, data, ("teacher_ms", "student_ms", "speedup"))
        if out.get("speedup") is None and out.get("teacher_ms") and out.get("student_ms"):
            out["speedup"] = out["teacher_ms"] / out["student_ms"]
        rows = out.get("at_lengths") if isinstance(out.get("at_lengths"), list) else []
        out["at_lengths"] = tuple(LengthLatency.from_json(row) for row in rows if isinstance(row, dict))
        own = out.get("own_lengths")
        out["own_lengths"] = OwnLengthLatency.from_json(own) if isinstance(own, dict) else None
        return cls(**out)

    def busy_cores(self):
        """The most cores other processes kept busy during any of the run's timings, or None if not recorded."""
        found = [part.other_processes_cores for part in (self, *self.at_lengths, self.own_lengths)
                 if part is not None and part.other_processes_cores is not None]
        return max(found) if found else None

    def to_json(self):
        out = _section_json(dataclasses.replace(self, at_lengths=None, own_lengths=None))  # left out when none
        if self.at_lengths:
            out["at_lengths"] = [_section_json(row) for row in self.at_lengths]
        if self.own_lengths is not None:
            out["own_lengths"] = _section_json(self.own_lengths)
        return out


@dataclass(frozen=True)
class LengthLatency:
    """One longer length of :class:`Latency`: teacher and student forward time at ``seq_len`` tokens, batch 1."""

    seq_len: int | None = None
    teacher_ms: float | None = None
    student_ms: float | None = None
    speedup: float | None = None
    repeats: int | None = None
    other_processes_cores: float | None = None

    @classmethod
    def from_json(cls, data):
        return cls(**_fields(cls, data, ("teacher_ms", "student_ms", "speedup")))


@dataclass(frozen=True)
class OwnLengthLatency:
    """Teacher and student mean forward time per example (ms) over ``examples`` examples of the report's split, each
    at its own length (``mean_tokens`` on average), batch 1, no padding."""

    examples: int | None = None
    mean_tokens: float | None = None
    teacher_ms: float | None = None
    student_ms: float | None = None
    speedup: float | None = None
    other_processes_cores: float | None = None

    @classmethod
    def from_json(cls, data):
        return cls(**_fields(cls, data, ("mean_tokens", "teacher_ms", "student_ms", "speedup")))


@dataclass(frozen=True)
class Selection:
    """How stage 2's model was chosen on the selection split, by the dev ``metric``: the
    ``candidates`` ``((epoch, score), ...)`` — epoch 0 is the stage-1 model, before any stage-2
    step, when it competed — and the ``selected_epoch``, the saved student (the first best: a tie
    keeps the earlier candidate; the stage-1 model was kept only when ahead of every epoch by at
    least ``margin``, ``stage2.stage1_margin`` standard errors of its dev score, None or 0: none).
    Reports written before the stage-1 model competed have none."""

    metric: str | None = None
    candidates: tuple = ()
    selected_epoch: int | None = None
    margin: float | None = None

    @property
    def stage1_kept(self):
        """The saved student is the stage-1 model: no stage-2 epoch beat it on dev."""
        return self.selected_epoch == 0 and any(epoch == 0 for epoch, _ in self.candidates)

    @classmethod
    def from_json(cls, data):
        data = data if isinstance(data, dict) else {}
        rows = data.get("candidates") if isinstance(data.get("candidates"), list) else []
        candidates = tuple((int(row["epoch"]), finite(row.get("score"))) for row in rows
                           if isinstance(row, dict) and finite(row.get("epoch")) is not None)
        selected = finite(data.get("selected_epoch"))
        return cls(metric=data.get("metric") if isinstance(data.get("metric"), str) else None,
                   candidates=candidates, selected_epoch=int(selected) if selected is not None else None,
                   margin=finite(data.get("margin")))

    def to_json(self):
        return {"metric": self.metric, "candidates": [{"epoch": e, "score": v} for e, v in self.candidates],
                "selected_epoch": self.selected_epoch, **({"margin": self.margin} if self.margin is not None else {})}


@dataclass(frozen=True)
class Recovery:
    """A student's recovery on ``split``: ``per_metric`` percentages and their ``average``."""

    split: str
    per_metric: dict
    average: float | None


# ---------------------------------------------------------------- the report

@dataclass(frozen=True)
class Report:
    """A run's results, as ``report.json`` holds them (see the module docstring for the layout).

    ``scores``: ``{"teacher" | "student_stage1" | "student": {split: {metric: value}}}``;
    ``curves`` and ``visuals`` are plain data (lists of dicts) for the figures; :meth:`to_json`
    gives the JSON form.
    """

    recipe: dict = field(default_factory=dict)
    task: TaskInfo = field(default_factory=TaskInfo)
    model: ModelInfo = field(default_factory=ModelInfo)
    scores: dict = field(default_factory=dict)
    attention: AttentionInfo = field(default_factory=AttentionInfo)
    timing: Timing = field(default_factory=Timing)
    latency: Latency = field(default_factory=Latency)
    selection: Selection = field(default_factory=Selection)
    curves: dict | None = None
    visuals: dict | None = None
    seeds: dict | None = None
    environment: dict | None = None
    data_hash: str | None = None
    created: str | None = None
    figures: tuple = ()

    # ---- reading ----------------------------------------------------------------------------------

    @classmethod
    def from_json(cls, data, where="report", required=REQUIRED_SECTIONS):
        """The report of ``report.json``'s content ``data`` (a one-line :class:`LinearizeError`
        unless it is a linearize report with the ``required`` sections)."""
        validate_report(data, where, required)
        data = _normalise_v1(data)

        def section(name):
            value = data.get(name)
            return dict(value) if isinstance(value, dict) else None

        return cls(recipe=section("recipe") or {}, task=TaskInfo.from_json(data.get("task")),
                   model=ModelInfo.from_json(data.get("model")), scores=_scores(data.get("scores")),
                   attention=AttentionInfo.from_json(data.get("attention")), timing=Timing.from_json(data.get("timing")),
                   latency=Latency.from_json(data.get("latency")),
                   selection=Selection.from_json(data.get("selection")), curves=section("curves"),
                   visuals=section("visuals"), seeds=section("seeds"), environment=section("environment"),
                   data_hash=data.get("data_hash") or None, created=data.get("created") or None,
                   figures=tuple(map(str, data["figures"])) if isinstance(data.get("figures"), list) else ())

    @classmethod
    def read(cls, path, required=REQUIRED_SECTIONS):
        """The report in ``path`` (``report.json`` or the run folder holding it)."""
        path = Path(path)
        if not path.exists():
            raise LinearizeError(f"{path} does not exist; pass a run folder that holds {REPORT_JSON}")
        if path.is_dir():
            path = path / REPORT_JSON
        if not path.is_file():
            raise LinearizeError(f"no report at {path}; pass a run folder that holds {REPORT_JSON} "
                                 "(the pipeline writes it at the end of a run)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise LinearizeError(f"{path} is not valid JSON ({reason}); re-run the pipeline to rewrite it") from None
        return cls.from_json(data, where=str(path), required=required)

    # ---- writing ----------------------------------------------------------------------------------

    def to_json(self):
        """``report.json``'s content (plain JSON data); empty sections are left out."""
        out = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "created": self.created,
               "recipe": plain(self.recipe), "task": self.task.to_json(), "model": self.model.to_json(),
               "scores": plain(self.scores)}
        student, stage1 = self.recovery("student"), self.recovery("student_stage1")
        if student.per_metric or stage1.per_metric:
            out["recovery"] = {"split": self.split, "per_metric": student.per_metric, "average": student.average,
                               "stage1_per_metric": stage1.per_metric, "stage1_average": stage1.average}
        for name in ("attention", "timing", "latency", "selection"):
            section = getattr(self, name)
            if section != type(section)():
                out[name] = section.to_json()
        for name in ("curves", "visuals", "seeds", "environment", "data_hash"):
            out[name] = plain(getattr(self, name))
        out["figures"] = list(self.figures)
        return {k: v for k, v in out.items() if v is not None}

    def with_figures(self, figures):
        return dataclasses.replace(self, figures=tuple(figures))

    # ---- what the renderers ask -------------------------------------------------------------------

    @property
    def split(self):
        """The split the recovery is reported on (``test`` when the task has labelled test data)."""
        return self.task.report_split or self.task.selection_split or "test"

    def scores_of(self, stage, split=None):
        """``{metric: value}`` of ``stage`` (``"teacher"``, ``"student_stage1"``, ``"student"``) on
        ``split`` (default the report split); ``{}`` when not measured."""
        return self.scores.get(stage, {}).get(split or self.split, {})

    @cached_property
    def metric_names(self):
        """The task's metrics, then any other metric the scores hold."""
        names = list(self.task.metric_names)
        for stage in ("student", "teacher", "student_stage1"):
            for split in dict.fromkeys([self.split, self.task.selection_split]):
                names += [name for name in self.scores.get(stage, {}).get(split, {}) if name not in names]
        return names

    @property
    def primary_metric(self):
        names = self.metric_names
        return self.task.primary_metric or (names[0] if names else "score")

    def chance_score(self):
        """The teacher's primary metric for a model that guesses: 1 / classes for accuracy, 0 for a
        correlation; None where it depends on the data (F1) or is not known (an older report)."""
        metric, classes = self.primary_metric, self.task.num_labels
        if self.task.embedding:
            return None
        if metric in CORRELATION_METRICS:
            return 0.0
        if metric == "accuracy" and isinstance(classes, int) and classes >= 2:
            return 1.0 / classes
        return None

    def teacher_at_chance(self):
        """Whether the teacher's primary score on the report split is at or below chance
        (:meth:`chance_score`, :data:`CHANCE_MARGIN` above it at most): then the student's recovery,
        a ratio to that score, says nothing."""
        chance, score = self.chance_score(), finite(self.scores_of("teacher").get(self.primary_metric))
        return chance is not None and score is not None and score <= chance + CHANCE_MARGIN

    def chance_warning(self):
        """The sentence the run's last line and ``report.md`` give when :meth:`teacher_at_chance`,
        else None."""
        if not self.teacher_at_chance():
            return None
        score, metric = self.scores_of("teacher")[self.primary_metric], self.primary_metric
        where = f"{score:.3f} on {self.task.num_labels} classes" if metric == "accuracy" else \
            f"{metric} {score:.3f}, chance 0"
        return (f"the teacher is at chance ({where}): the recovery says nothing; train the teacher longer or on "
                "more data")

    def recovery(self, stage="student"):
        """The :class:`Recovery` of ``stage`` (``"student"``: after stage 2; ``"student_stage1"``)
        against the teacher, on the report split. An embedding task's recovery is its score, the
        mean cosine to the teacher's embeddings (× 100; the teacher's own is 1), not the average
        over its metrics."""
        per_metric, average = recovery(self.scores_of("teacher"), self.scores_of(stage))
        if self.task.embedding:
            average = per_metric.get(self.primary_metric)
        return Recovery(split=self.split, per_metric=per_metric, average=average)


def validate_report(data, where="report", required=REQUIRED_SECTIONS):
    """Raise a one-line :class:`LinearizeError` unless ``data`` is a version-1 linearize report
    holding the ``required`` sections (each an object)."""
    if not isinstance(data, dict):
        raise LinearizeError(f"{where} is not a JSON object; expected a linearize report (schema {SCHEMA!r})")
    if data.get("schema") != SCHEMA:
        raise LinearizeError(f"{where} has schema {data.get('schema')!r}, not {SCHEMA!r}: it is not a linearize "
                             "report")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        newer = isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION
        hint = "upgrade linearize to read it" if newer else "re-run the pipeline to write a current one"
        raise LinearizeError(f"{where} has schema_version {version!r}; this linearize reads version "
                             f"{SCHEMA_VERSION} ({hint})")
    missing = [name for name in required if not isinstance(data.get(name), dict)]
    if missing:
        raise LinearizeError(f"{where} lacks the section(s) {', '.join(missing)} (each must be an object); "
                             "re-run the pipeline to write a complete report")
    return data


def load_report(path):
    """The :class:`Report` in ``path`` (``report.json`` or the run folder holding it)."""
    return Report.read(path)


def as_report(report):
    """``report`` as a :class:`Report` (a dict is read as ``report.json``'s content)."""
    return report if isinstance(report, Report) else Report.from_json(report, required=())


def _scores(data):
    """``{stage: {split: {metric: finite number or None}}}`` of the scores section."""
    out = {}
    for stage, splits in (data or {}).items():
        if isinstance(splits, dict):
            out[stage] = {split: {name: _number(value) for name, value in metrics.items()}
                          for split, metrics in splits.items() if isinstance(metrics, dict)}
    return out


# ---------------------------------------------------------------- earlier layouts

def _normalise_v1(data):
    """Version 1 as every linearize so far wrote it, in the form :class:`Report` holds.

    - ``selection`` (stage 2's candidates and the one kept) is optional: an older report has
      none (its stage 2 chose among its own epochs only) and reads as an empty :class:`Selection`;

    - the report split was named by ``recovery.split`` (now ``task.report_split``; the stored
      recovery itself is recomputed from the scores);
    - a LUNA probe's ψ could be given channel-major (L × len(grid)): transposed to grid-major;
    - an image's [CLS] attention could include the [CLS] token itself (``grid`` cells + 1): dropped;
    - visual entries without the data a figure needs are dropped, and when text and image entries
      are mixed, those of the task's kind are kept.
    """
    data = dict(data)
    split = (data.get("recovery") or {}).get("split") if isinstance(data.get("recovery"), dict) else None
    if split and isinstance(data.get("task"), dict):
        data["task"] = {**data["task"], "report_split": split}
    elif split:
        data["task"] = {"report_split": split}
    visuals = data.get("visuals")
    if isinstance(visuals, dict):
        kind = (data.get("task") or {}).get("kind") if isinstance(data.get("task"), dict) else None
        visuals = dict(visuals)
        for name, normalise in (("luna_channels", _luna_entry), ("cls_attention", _cls_entry)):
            if name in visuals:
                entries = visuals[name] if isinstance(visuals[name], list) else []
                visuals[name] = [e for e in (normalise(entry) for entry in entries) if e is not None]
        cls_entries = visuals.get("cls_attention") or []
        if len({_cls_kind(e) for e in cls_entries}) > 1:  # one figure shows one kind
            want = "image" if kind == "image" else "text"
            visuals["cls_attention"] = [e for e in cls_entries if _cls_kind(e) == want]
        data["visuals"] = visuals
    return data


def _luna_entry(entry):
    if not isinstance(entry, dict):
        return None
    grid, psi = entry.get("grid"), entry.get("psi")
    if not (isinstance(grid, list) and isinstance(psi, list) and grid and psi):
        return None
    if len(psi) != len(grid) and isinstance(psi[0], list) and len(psi[0]) == len(grid):
        psi = [list(column) for column in zip(*psi)]  # given as L x len(grid)
    if len(psi) != len(grid):
        return None
    return {**entry, "psi": [row if isinstance(row, list) else [row] for row in psi]}


def _cls_kind(entry):
    return "text" if "tokens" in entry else "image"


def _cls_entry(entry):
    if not isinstance(entry, dict):
        return None
    teacher, student = entry.get("teacher"), entry.get("student")
    if not (isinstance(teacher, list) and isinstance(student, list) and teacher and len(teacher) == len(student)):
        return None
    if isinstance(entry.get("tokens"), list) and len(entry["tokens"]) == len(teacher):
        return entry
    entry = {k: v for k, v in entry.items() if k != "tokens"}
    if isinstance(entry.get("grid"), list) and len(entry["grid"]) == 2:
        gh, gw = (int(v) for v in entry["grid"])
        if len(teacher) == gh * gw + 1:  # the [CLS] token itself came along: drop it
            entry = {**entry, "teacher": teacher[1:], "student": student[1:]}
        if len(entry["teacher"]) == gh * gw:
            return entry
    return None
