"""`linearize run`'s orchestration: teacher → convert + stage 1 → stage 2 → measurements → report.

Each stage either reuses its finished result from the run folder (``state.json``) or makes it,
then scores the model on the selection and report splits, saves it and records the result.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import STAGE1_KEYS, TEACHER_KEYS, RunConfig, config_difference
from ..convert import convert
from ..distill import attention_distances, distill
from ..errors import LinearizeError
from ..evaluation import scores
from ..outputs import writes_output
from ..finetune import finetune
from ..report import StageResult
from ..trackers import check_report_to
from ..training import has_device, main_process_first, on_main_process
from .artifacts import RunState, drop_resume_checkpoints, link_or_copy, load_saved, save_model
from .inputs import (TaskData, attention_dropout_warning, build_source_model, check_head, check_label_order,
                     source_config)
from .measurements import (cls_attention, latency, latency_at_lengths, latency_batch, latency_per_example, longer_lengths,
                           luna_channels, with_other_load)
from .run_report import build_report, write_run_report

STAGES = ("teacher", "stage1", "stage2")
STAGE_DIRS = {"teacher": "teacher", "stage1": "stage1", "stage2": "model"}


@dataclass
class RunContext:
    """What every step of one run reads: its configuration, its folder and state, the task data
    (tokenised once) and the evaluation loaders every stage is scored with."""

    config: RunConfig
    out_dir: Path
    state: RunState
    task: TaskData
    eval_loaders: dict
    report_split: str
    progress: bool
    log: Callable
    started: float
    report_to: str = "none"  # experiment trackers of every training stage (not part of the recipe)

    def train_loader(self, batch_size):
        """A fresh shuffled train loader (its own seeded generator) at a stage's batch size."""
        return self.task.loaders(batch_size, self.config.seed)["train"]

    def score(self, model):
        """``{split: metrics}`` on the selection split and the report split (an embedding task with
        a similarity file: its Spearman correlation, ``sts_spearman``, with the report split's; with
        ``data.document_length``: the agreement on whole documents, ``doc_cosine`` and ``doc_top10_overlap``)."""
        splits = ["validation"] + ([self.report_split] if self.report_split != "validation" else [])
        result = scores(model, self.eval_loaders, self.task.spec, splits, self.progress)
        if self.task.similarity is not None:
            result[self.report_split]["sts_spearman"] = self.task.similarity_spearman(model)
        if self.task.documents is not None:
            result[self.report_split].update(self.task.document_agreement(model))
        return result

    def finish(self, stage, model, result):
        """Score ``model``, save it into the stage's folder, record ``result`` (a
        :class:`StageResult`) with its scores and drop the stage's checkpoints."""
        model.eval()
        result = result.with_scores(self.score(model))
        on_main_process(save_model, model, self.task.processor, self.out_dir / STAGE_DIRS[stage])
        self.state.finish(stage, result)
        on_main_process(drop_resume_checkpoints, self.out_dir / "work" / stage)
        return result


@writes_output("out_dir")
def run(config, out_dir, *, overwrite=False, progress=True, log=print, teacher_from=None, stage1_from=None,
        report_to="none"):
    """Run the whole pipeline of ``config`` (a checked :class:`~linearize.config.RunConfig`, as
    ``recipes.load_recipe`` returns it) into ``out_dir``; the :class:`~linearize.report.Report`.

    ``teacher_from``: a finished run folder of the same model, task, data and seed whose teacher
    is reused instead of fine-tuning another (``linearize compare`` shares one per seed).
    ``stage1_from``: a run folder whose finished teacher and stage 1 were made with this run's
    stage-1 settings (:data:`~linearize.config.STAGE1_KEYS`): both are reused, as a resumed run
    reuses its own (``linearize compare`` shares them between variants of stage 2).
    ``report_to``: experiment trackers for every training stage (``linearize.trackers``).
    """
    check_report_to(report_to)  # before the teacher trains
    check_teacher_from(teacher_from, out_dir)  # before the data loads
    ctx = start_run(config, out_dir, overwrite=overwrite, progress=progress, log=log, report_to=report_to)
    if stage1_from is not None and not ctx.state.done("stage1"):
        share_stage1(ctx, stage1_from)
    if teacher_from is not None and not ctx.state.done("teacher"):
        share_teacher(ctx, teacher_from)
    (teacher, teacher_result), teacher_here = _timed(teacher_stage, ctx)
    (student, stage1_result), stage1_here = _timed(stage1, ctx, teacher)
    (student, stage2_result), stage2_here = _timed(stage2, ctx, teacher, student, stage1_result)
    log(f"[5/6] measuring latency ({config.eval.latency_repeats} timed passes per model) and attention"
        if not ctx.state.done("latency") else "[5/6] latency as measured before (state.json); attention")
    student.to(next(teacher.parameters()).device)  # a resumed run reloads finished stages on the CPU
    timing, seq_len, batch = measure_latency(ctx, teacher, student)
    visuals = figure_data(ctx, teacher, student)
    log("[6/6] writing the report")
    # total: this call's wall time plus what each stage took in earlier calls (a stage reused whole, a shared
    # teacher, or the steps a resumed stage had done: its own seconds beyond what it took in this call)
    earlier = sum(max(0.0, result.seconds - here) for result, here in
                  ((teacher_result, teacher_here), (stage1_result, stage1_here), (stage2_result, stage2_here)))
    total = time.perf_counter() - ctx.started + earlier
    report = build_report(ctx.config, ctx.task, student, (teacher_result, stage1_result, stage2_result),
                          ctx.report_split, timing, seq_len, batch, visuals, total)
    return on_main_process(write_run_report, report, out_dir)  # every process returns the written report


def _timed(call, *args):
    """``(call(*args), its wall seconds)``."""
    started = time.perf_counter()
    return call(*args), time.perf_counter() - started


@writes_output("out_dir")
def run_teacher(config, out_dir, *, overwrite=False, progress=True, log=print):
    """The teacher stage of ``config`` alone, as :func:`run` makes it (fine-tuned, scored on the
    selection and report splits, saved into ``out_dir/teacher``, resumable); ``(its
    StageResult, the report split)``. A baseline that is only a softmax model: e.g. the teacher
    cut at 512 tokens beside a long-input run (docs/experiments/long-reviews)."""
    ctx = start_run(config, out_dir, overwrite=overwrite, progress=progress, log=log)
    teacher_stage(ctx)
    return ctx.state.get("teacher"), ctx.report_split


def start_run(config, out_dir, *, overwrite, progress, log, report_to="none"):
    """Prepare the run folder (checking a resumed one holds the same configuration), seed
    everything, load the data and the evaluation loaders: every input is checked before any
    stage runs (the configuration itself was checked when it was loaded)."""
    from accelerate.utils import set_seed

    from ..attention.feature_maps import options_for
    from ..convert.loading import check_model_name, check_reachable
    from ..outputs import check_output_path

    # the run keeps (and compares with its folder) the options its own method is converted with
    config = dataclasses.replace(config, options=options_for(config.method, config.options))
    out_dir = check_output_path(out_dir)
    check_run_folder(out_dir, overwrite)
    on_main_process(_make_run_folder, out_dir, overwrite)
    state = RunState(out_dir, config)
    set_seed(config.seed)
    started = time.perf_counter()
    log(f"[1/6] data: {config.task}")
    check_reachable(config.model, check_model_name(config.model))  # its tokenizer loads with the data
    with main_process_first():  # several processes: a download (or a cache) is made once
        task = TaskData.load(config)
    if task.spec.is_embedding:  # the teacher is the encoder as it is: its embeddings are the target
        config = dataclasses.replace(config, head="base", teacher=dataclasses.replace(config.teacher, finetune=False))
    report_split = "test" if "test" in task.data and len(task.data["test"]) else "validation"
    eval_loaders = task.loaders(config.eval.batch_size, config.seed)
    return RunContext(config, out_dir, state, task, eval_loaders, report_split, progress, log, started, report_to)


def check_run_folder(out_dir, overwrite):
    """A one-line ``LinearizeError`` when ``out_dir`` holds something other than a run (a converted model, a
    user's files): a run would write its stages beside them, and a later ``--teacher-from`` would take the
    mixture for a run. A run folder has ``state.json`` once a stage finished; before that only ``work/``."""
    if overwrite or not out_dir.is_dir() or (out_dir / "state.json").is_file():
        return
    others = sorted(p.name for p in out_dir.iterdir() if not p.name.startswith(".") and p.name != "work")
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise LinearizeError(f"{out_dir} is not a run folder (it holds {shown} and no state.json); choose another "
                             "--out, or pass --overwrite to replace it")


def _make_run_folder(out_dir, overwrite):
    """The run folder, emptied first with ``overwrite``."""
    import shutil

    if overwrite and out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)


def check_teacher_from(teacher_from, out_dir):
    """A one-line ``LinearizeError`` when ``teacher_from`` names no run folder with a finished teacher and this
    run (``out_dir``) has none of its own yet; the recipe match is checked when it is shared (:func:`share_teacher`)."""
    if teacher_from is None or RunState(out_dir, None).done("teacher"):
        return
    if not Path(teacher_from).is_dir():
        raise LinearizeError(f"--teacher-from {teacher_from} does not exist; pass a run folder whose teacher finished")
    if not RunState(teacher_from, None).done("teacher"):
        raise LinearizeError(f"{teacher_from} has no finished teacher to share (no state.json recording one); pass "
                             "a run folder whose teacher finished, or drop --teacher-from")


def share_teacher(ctx, teacher_from):
    """Take the finished teacher of the run folder ``teacher_from`` (hard-linked) after checking
    that it was made with this run's model, head, task, data, teacher settings and seed."""
    shared = RunState(teacher_from, None)
    if not shared.done("teacher"):
        raise LinearizeError(f"{teacher_from} has no finished teacher to share")
    difference = config_difference(shared.config, ctx.config, TEACHER_KEYS)
    if difference is not None:
        raise LinearizeError(f"{teacher_from}'s teacher was made with another recipe ({difference}); match it, "
                             "or drop --teacher-from (--teachers-from), or compare into another --out")
    on_main_process(link_or_copy, Path(teacher_from) / "teacher", ctx.out_dir / "teacher")
    ctx.state.finish("teacher", shared.get("teacher"))


def share_stage1(ctx, stage1_from):
    """Take the finished teacher and stage-1 student of the run folder ``stage1_from`` (hard-linked)
    after checking that they were made with this run's stage-1 settings; a teacher this run already
    finished must be that one."""
    shared = RunState(stage1_from, None)
    if not (shared.done("teacher") and shared.done("stage1")):
        raise LinearizeError(f"{stage1_from} has no finished stage 1 to share")
    difference = config_difference(shared.config, ctx.config, STAGE1_KEYS)
    if difference is not None:
        raise LinearizeError(f"{stage1_from}'s stage 1 was made with other settings ({difference})")
    if ctx.state.done("teacher") and ctx.state.get("teacher") != shared.get("teacher"):
        raise LinearizeError(f"{ctx.out_dir} has a teacher of its own, not {stage1_from}'s: its stage 1 was "
                             "distilled from another teacher")
    for stage in ("teacher", "stage1"):
        if not ctx.state.done(stage):
            on_main_process(link_or_copy, Path(stage1_from) / STAGE_DIRS[stage], ctx.out_dir / STAGE_DIRS[stage])
            ctx.state.finish(stage, shared.get(stage))
    on_main_process(drop_resume_checkpoints, ctx.out_dir / "work" / "stage1")  # a stage 1 begun here before
    ctx.log(f"teacher and stage 1: shared with {stage1_from} (the same stage-1 settings)")


def teacher_stage(ctx):
    """The softmax teacher: the finished one, or the source model fine-tuned on the task (or, with
    ``teacher.finetune: false``, taken as it is)."""
    done = ctx.state.done("teacher")
    if done:
        ctx.log("[2/6] teacher: reusing the finished teacher")
        teacher, result = load_saved(ctx.out_dir / "teacher", converted=False), ctx.state.get("teacher")
    else:
        teacher, result = _make_teacher(ctx)
    teacher.eval()
    if ctx.task.spec.is_embedding:  # the teacher's embeddings: the target and the reference of every score
        ctx.task.set_targets(teacher)
        ctx.eval_loaders = ctx.task.loaders(ctx.config.eval.batch_size, ctx.config.seed)
    if not done:
        result = ctx.finish("teacher", teacher, result)
    return teacher, result


def _make_teacher(ctx):
    from ..convert.api import check_convertible

    config, spec = ctx.config, ctx.task.spec
    if not config.teacher.finetune and not isinstance(config.model, dict):  # the checkpoint's own classes, before
        check_label_order(source_config(config.model), spec, config.model)  # the task's names replace them
    teacher, source = build_source_model(config, spec)
    # the student's conversion is checked now, not after the teacher's fine-tuning
    check_convertible(teacher, config.method, layers=config.layers, **config.hybrid.to_dict(), **config.options)
    check_keep_softmax(teacher, config)
    if not config.teacher.finetune:
        ctx.log("[2/6] teacher: using the checkpoint as it is (teacher.finetune: false)")
        check_head(teacher, spec, config.model)
        return teacher, StageResult(finetuned=False)
    ctx.log(f"[2/6] teacher: fine-tuning softmax {config.model if source else 'model from scratch'}")
    warning = attention_dropout_warning(teacher, config.data.max_length, has_device())
    if warning:
        ctx.log(f"warning: {warning}")
    settings = config.stage("teacher", ctx.report_to)
    result = finetune(teacher, ctx.train_loader(settings.batch_size), ctx.eval_loaders["validation"], spec,
                      ctx.out_dir / "work" / "teacher", config=settings, progress=ctx.progress, log=ctx.log)
    return teacher, dataclasses.replace(result, finetuned=True)


def stage1(ctx, teacher):
    """A copy of the teacher converted to the run's method, its feature maps distilled against
    the teacher's attention (or, with ``stage1.enabled: false``, only measured)."""
    from accelerate.utils import set_seed

    if ctx.state.done("stage1"):
        ctx.log("[3/6] stage 1: reusing the distilled student")
        return load_saved(ctx.out_dir / "stage1", converted=True), ctx.state.get("stage1")
    config, settings = ctx.config, ctx.config.stage("stage1", ctx.report_to)
    ctx.log(f"[3/6] convert to {config.method}; stage 1: attention distillation")
    student = copy.deepcopy(teacher)
    # the new feature maps' initial weights come from the seed alone, not from how much randomness the
    # stages before used: a run whose teacher was fine-tuned here and one that reused it make the same student
    set_seed(config.seed)
    convert(student, config.method, layers=config.layers, source=str(config.model), **config.hybrid.to_dict(),
            **config.options)
    if settings.enabled:
        result = distill(student, ctx.train_loader(settings.batch_size), settings,
                         eval_loader=ctx.eval_loaders["validation"], eval_batches=settings.eval_batches,
                         checkpoint_dir=ctx.out_dir / "work" / "stage1", progress=ctx.progress, log=ctx.log)
    else:
        per_layer = attention_distances(student, ctx.eval_loaders["validation"], settings.eval_batches,
                                        block_size=settings.block_size)
        result = StageResult(skipped=True, reason="stage1.enabled is false", per_layer_before=per_layer,
                             per_layer_after=per_layer, steps=0)
    if settings.keep_softmax:
        keep_softmax(student, result, settings.keep_softmax, ctx.log)
    return student, ctx.finish("stage1", student, result)


def check_keep_softmax(model, config):
    """``stage1.keep_softmax`` must leave a converted layer: a one-line error before the teacher trains."""
    from ..convert import attention_modules

    converted = len(config.layers) if config.layers else len(attention_modules(model))
    check_keep_count(config.stage1.keep_softmax, converted)


def check_keep_count(count, converted, setting="stage1.keep_softmax"):
    """Giving softmax back to ``count`` of ``converted`` layers must leave one converted."""
    if count >= converted:
        raise LinearizeError(f"{setting} {count} would give softmax back to every converted layer ({converted}); "
                             "pass fewer")


def keep_softmax(student, result, count, log):
    """Give back softmax attention to the ``count`` converted layers whose attention KL after stage 1
    (``result.per_layer_after``) is highest; the others keep their distilled maps."""
    from ..convert import conversion_record
    from ..convert.api import revert_layers

    distances = {int(layer): row["kl"] for layer, row in result.per_layer_after.items()}
    converted = list(conversion_record(student).layers)
    check_keep_count(count, len(converted))
    worst = sorted(sorted(converted, key=lambda layer: -distances[layer])[:count])
    log(f"      keeping softmax in layer{'s' if count > 1 else ''} {', '.join(map(str, worst))} (stage1.keep_softmax: "
        f"the highest attention KL, {', '.join(f'{distances[layer]:.3f}' for layer in worst)})")
    revert_layers(student, worst)


def stage2(ctx, teacher, student, stage1_result):
    """The student fine-tuned on the task (with the teacher's outputs as a distillation target when
    ``stage2.kd_weight`` > 0), or, with ``stage2.enabled: false``, stage 1's student as it is.

    When stage 1 ran, its student competes in stage 2's selection as epoch 0 with the dev score it
    was given when stage 1 finished: the saved model is stage 1's when no stage-2 epoch beats it."""
    if ctx.state.done("stage2"):
        ctx.log("[4/6] stage 2: reusing the fine-tuned student")
        return load_saved(ctx.out_dir / "model", converted=True), ctx.state.get("stage2")
    settings = ctx.config.stage("stage2", ctx.report_to)
    if not settings.enabled:
        result = StageResult(skipped=True, scores=stage1_result.scores)
        on_main_process(save_model, student, ctx.task.processor, ctx.out_dir / "model")
        ctx.state.finish("stage2", result)
        return student, result
    ctx.log("[4/6] stage 2: fine-tuning the student")
    result = finetune(student, ctx.train_loader(settings.batch_size), ctx.eval_loaders["validation"], ctx.task.spec,
                      ctx.out_dir / "work" / "stage2", config=settings, teacher=teacher, progress=ctx.progress,
                      log=ctx.log, initial_candidate=not stage1_result.skipped,
                      initial_metrics=stage1_result.scores["validation"])
    return student, ctx.finish("stage2", student, result)


def measure_latency(ctx, teacher, student):
    """Teacher and student forward latency on a batch at the run's sequence length, measured once:
    a resumed run keeps the figure of the run that made the model."""
    batch, seq_len = latency_batch(ctx.config, ctx.task.spec, ctx.eval_loaders[ctx.report_split], teacher)
    if ctx.task.spec.kind == "text" and seq_len < ctx.config.data.max_length:
        ctx.log(f"      latency timed at {seq_len:,} tokens, not data.max_length {ctx.config.data.max_length:,} "
                "(eval.latency_max_length)")
    repeats = ctx.config.eval.latency_repeats
    if not ctx.state.done("latency"):
        # timed on the main process alone (the others wait: they would share its cores)
        ctx.state.finish("latency", on_main_process(with_other_load, latency, teacher, student, batch, repeats))
    lengths = longer_lengths(ctx.config, ctx.task.spec, teacher, seq_len)
    if lengths and not ctx.state.done("latency_lengths"):
        ctx.log(f"      and at {', '.join(f'{n:,}' for n in lengths)} tokens (eval.latency_lengths)")
        ctx.state.finish("latency_lengths", on_main_process(with_other_load, latency_at_lengths, teacher, student,
                                                            batch["input_ids"][:1], lengths, repeats))
    at_lengths = ctx.state.get("latency_lengths") if ctx.state.done("latency_lengths") else []
    return {**ctx.state.get("latency"), "at_lengths": at_lengths, "own_lengths": _own_length_latency(ctx, teacher, student)}, \
        seq_len, batch


def _own_length_latency(ctx, teacher, student):
    """The mean time per example of the report's split at its own length (``eval.latency_examples``; text tasks),
    measured once, or None."""
    count = ctx.config.eval.latency_examples
    if ctx.task.spec.kind != "text" or not count:
        return None
    if not ctx.state.done("latency_examples"):
        ctx.log(f"      and on {count:,} {ctx.report_split} examples at their own lengths (eval.latency_examples)")
        ctx.state.finish("latency_examples", on_main_process(with_other_load, latency_per_example, teacher, student,
                                                             ctx.eval_loaders[ctx.report_split], count))
    return ctx.state.get("latency_examples")


def figure_data(ctx, teacher, student):
    """The report's figure data: the feature maps' probes and CLS attention of teacher and student."""
    return {"luna_channels": luna_channels(student, ctx.eval_loaders["validation"]),
            "cls_attention": cls_attention(teacher, student, ctx.eval_loaders[ctx.report_split], ctx.task.spec,
                                           ctx.task.processor, ctx.config.eval.examples)}
