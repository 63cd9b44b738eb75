"""The single stages that `linearize distill / finetune / eval` call: each loads a model (a
converted folder or a softmax checkpoint) and the task's data, runs one stage and saves the model."""

from __future__ import annotations

import json
from pathlib import Path

from ..attention.feature_maps import check_method_options
import dataclasses

from ..config import DataConfig, EvalConfig, FinetuneConfig, RunConfig, Stage1Config
from ..convert import conversion_record, convert, feature_maps_of
from ..convert.api import hybrid_settings
from ..distill import distill
from ..errors import LinearizeError
from ..outputs import writes_output
from ..evaluation import scores
from ..finetune import finetune
from ..training import main_process_first, on_main_process
from .artifacts import remove_work_dir, save_model
from .stages import check_keep_count, keep_softmax
from .inputs import (TaskData, check_head, check_label_order, check_model_kind, check_task_head, check_trained_head,
                     name_labels, source_config)


DISTILL_RESULT = "distill.json"  # stage 1's result, beside the model `linearize distill` saves


def single_stage_config(model, task, data=None, eval=None):
    """The checked :class:`~linearize.config.RunConfig` of a single stage: the defaults with
    ``model``, ``task`` and the ``data`` / ``eval`` sections (a :class:`DataConfig`, or a dict of
    its fields; an :class:`EvalConfig`); ``model`` as :func:`stage_model` gave it."""
    if isinstance(data, dict):
        data = DataConfig(**{k: v for k, v in data.items() if v is not None})
    return RunConfig(name="stage", model=model, task=task, data=data or DataConfig(),
                     eval=eval or EvalConfig()).validate()


def stage_model(model):
    """``model`` as a stage reads it: a run folder (``linearize run``'s, with no config.json of its own) stands for
    its ``model/``, the student; a model folder, a Hub id, an alias or a loaded model as given."""
    from ..convert.loading import run_model_folder

    if isinstance(model, (str, Path)) and Path(model).expanduser().is_dir():
        return str(run_model_folder(model))
    return model


def load_model_for_task(model, spec, head=None):
    """A converted folder (``linearize.load``) or a softmax checkpoint with the task's head."""
    from ..convert.loading import load_source_model, resolve_model_name

    path = Path(resolve_model_name(model)) if isinstance(model, str) else None
    if path is not None and (path / "config.json").is_file():
        config = json.loads((path / "config.json").read_text())
        if config.get("linearize"):
            import linearize

            if head is not None:
                raise LinearizeError(f"{model} is converted already, with the head it was converted with, so --head "
                                     f"{head} cannot take effect: drop --head, or convert its softmax source with "
                                     f"--head {head}")
            return linearize.load(path), True
    default_head = "image-classification" if spec.kind == "image" else "base" if spec.is_embedding else \
        "sequence-classification"
    if head is None:  # the task's kind picks the head: a model of the other kind is told so, not the head
        check_model_kind(source_config(model), spec, model)
    return load_source_model(model, head=head or default_head, **spec.model_config_kwargs()), False


def _stage_inputs(config, head=None):
    """``(task data, model, converted?)`` of a single stage's ``config`` (:func:`single_stage_config`)."""
    from .inputs import embedding_inputs, load_data, load_processor

    with main_process_first():  # several processes: a download (or a cache) is made once
        loaded, spec = load_data(config.task, config.data)
        spec, similarity = embedding_inputs(config.model, spec, config.data.similarity_file)
        net, converted = load_model_for_task(config.model, spec, head)
        processor = load_processor(config.model, spec, config.data.image_size)
    if converted:
        check_head(net, spec, config.model)
    return TaskData(config.data, config.eval, loaded, spec, processor, similarity=similarity), net, converted


def _work_dir(out):
    return Path(out).with_name(Path(out).name + ".work")


@writes_output("out")
def distill_model(model, task, out, *, method=None, options=None, layers=None, hybrid=None, config=None, data=None,
                  overwrite=False, resume=True, keep_work=False, progress=True, log=print):
    """Stage 1 alone: distill a converted model (or convert ``model`` with ``method`` first, hybrid with
    ``hybrid``: ``{window, sinks, gamma}``, as ``linearize.convert`` takes them), save it; its
    :class:`~linearize.report.StageResult`. ``config``: a :class:`Stage1Config` (its batch size,
    dev batches and ``keep_softmax`` included; a plain ``DistillConfig`` takes their defaults);
    ``data``: a :class:`DataConfig`.

    Checkpoints go to ``<out>.work``; an interrupted run resumes from there unless ``resume=False``
    (which clears them and starts afresh). After success it is deleted (its ``metrics.jsonl``
    moves into ``out``) unless ``keep_work``."""
    from ..outputs import prepare_output_dir

    if config is not None and not isinstance(config, Stage1Config):
        config = Stage1Config(**dataclasses.asdict(config))
    config = (config or Stage1Config()).check()
    model, hybrid = stage_model(model), dict(hybrid or {})
    if method is not None:
        check_method_options(method, options or {})
        hybrid_settings(**hybrid, method=method)
    check_same_conversion(model, method, layers, options, hybrid)
    run_config = single_stage_config(model, task, data)
    out = prepare_output_dir(out, overwrite=overwrite, inputs=[model])
    task_data, net, converted = _stage_inputs(run_config)
    if not converted:
        if method is None:
            raise LinearizeError(f"{model} is not a converted model: pass --method to convert it first")
        convert(net, method, layers=layers, source=str(model), **hybrid, **(options or {}))
    if not any(p.numel() for fm in feature_maps_of(net).values() for p in fm.parameters()):
        method_name = conversion_record(net).method
        raise LinearizeError(f"{method_name} has no learnable feature-map parameters: stage 1 has nothing to "
                             "train; fine-tune it directly with `linearize finetune`")
    check_keep_count(config.keep_softmax, len(conversion_record(net).layers), "--keep-softmax")  # before training
    loaders = task_data.loaders(config.batch_size, config.seed)
    result = distill(net, loaders["train"], config, eval_loader=loaders["validation"],
                     eval_batches=config.eval_batches, checkpoint_dir=_work_dir(out), resume=resume,
                     progress=progress, log=log)
    if config.keep_softmax:
        keep_softmax(net, result, config.keep_softmax, log)
    on_main_process(save_model, net, task_data.processor, out, {DISTILL_RESULT: result.to_dict()})
    if not keep_work:
        on_main_process(remove_work_dir, _work_dir(out), out)
    return result


def check_same_conversion(model, method=None, layers=None, options=None, hybrid=None):
    """A converted folder ``model`` is distilled as it was converted: a ``method``, ``layers``,
    ``options`` or hybrid setting (``hybrid``: ``{window, sinks, gamma}`` given) that differ from its
    own could not take effect, so they are a one-line error (the same values, or none, pass). Checked
    before anything loads."""
    from ..attention.feature_maps import check_method_options, method_options
    from ..convert.loading import resolve_model_name

    path = Path(resolve_model_name(model)) if isinstance(model, (str, Path)) else None
    record = _folder_record(path)
    if record is None:
        return
    if options:  # an option the method does not have is that, not a difference a re-conversion would make
        check_method_options(method or record.method, options)
    defaults = method_options(record.method) if method in (None, record.method) else {}
    differs = []
    if method is not None and method != record.method:
        differs.append(f"method {method!r}")
    if layers is not None and sorted(layers) != sorted(record.layers):
        differs.append(f"layers {list(layers)}")
    if options and {**defaults, **record.options, **options} != {**defaults, **record.options}:
        differs.append("options " + ", ".join(f"{key}={value}" for key, value in options.items()))
    differs += _hybrid_differences(record, hybrid or {})
    if differs:
        own = ", ".join(f"{key}={value}" for key, value in record.options.items()) or "default options"
        raise LinearizeError(f"{model} is already converted to {record.method} (layers {list(record.layers)}, {own}), "
                             f"so {' and '.join(differs)} cannot take effect: distil it as it is (without "
                             f"--method/--layers/-o), or convert its softmax source ({record.source}) with "
                             f"{' and '.join(differs)}")


def _hybrid_differences(record, hybrid):
    """The hybrid settings given in ``hybrid`` that differ from the folder's ``record`` (``gamma`` is only
    where γ starts: a converted folder's γ is trained already, so any given γ differs)."""
    from ..attention.hybrid import parse_sinks

    own = {"window": record.window, "sinks": record.sinks,
           "hybrid_layers": None if record.hybrid_layers is None else sorted(record.hybrid_layers)}
    read = {"sinks": parse_sinks, "hybrid_layers": lambda value: sorted(value)}
    given = {key: read.get(key, lambda item: item)(value) for key, value in hybrid.items()}
    return [f"--{key.replace('_', '-')} {hybrid[key]}" for key, value in given.items()
            if key == "gamma" or value != own[key]]


def _folder_record(path):
    """The conversion record of the model folder ``path``, or None (not a folder, or not converted)."""
    from ..convert.loading import read_conversion_record

    if path is None or not (path / "config.json").is_file():
        return None
    try:
        return read_conversion_record(path)[1]
    except LinearizeError:  # not converted (a softmax checkpoint): converted with --method later
        return None


@writes_output("out")
def finetune_model(model, task, out, *, config=None, head=None, data=None, overwrite=False, resume=True,
                   teacher=None, keep_work=False, progress=True, log=print):
    """Stage 2 alone (or making a softmax teacher): fine-tune, keep the best dev checkpoint, save it.

    ``teacher`` (a folder or checkpoint with the task's head): the model whose outputs the
    ``config.kd_weight`` term distils from. A stage-1 output (a ``linearize distill`` folder, with
    its ``distill.json``) competes in the selection as epoch 0: when no epoch beats it on the dev
    split, it is the model saved (``best_epoch`` 0).

    Checkpoints go to ``<out>.work``; an interrupted run resumes from there unless ``resume=False``
    (which clears them and starts afresh). After success it is deleted (its ``metrics.jsonl``
    moves into ``out``) unless ``keep_work``. ``config``: a :class:`FinetuneConfig`; ``data``: a
    :class:`DataConfig`. Returns the :class:`~linearize.report.StageResult`, with the scores of
    every labelled non-train split."""
    from ..outputs import prepare_output_dir

    config = (config or FinetuneConfig()).check()
    model = stage_model(model)
    config.check_stage1_margin(is_stage1_output(model), "--stage1-margin")
    run_config = single_stage_config(model, task, data)
    if teacher is None and config.kd_weight:  # before the model and the data load
        raise LinearizeError(f"kd_weight {config.kd_weight:g} distils toward a softmax teacher's outputs, and none is "
                             "given: pass --teacher (the softmax model the student was converted from), or drop "
                             "--kd-weight")
    out = prepare_output_dir(out, overwrite=overwrite, inputs=[model, teacher])
    task_data, net, converted = _stage_inputs(run_config, head)
    if teacher is not None:
        check_teacher(teacher, task_data.spec, config)
        teacher, _ = load_model_for_task(teacher, task_data.spec, head)
        check_head(teacher, task_data.spec, "the teacher")
        check_label_order(teacher.config, task_data.spec, "the teacher")
    if not task_data.spec.is_embedding:
        check_task_head(net, model)
        name_labels(net, task_data.spec)  # the saved head answers in the task's classes
    elif teacher is None:
        raise LinearizeError("the embeddings task learns a teacher's sentence embeddings: pass --teacher (the "
                             "softmax model, e.g. the source checkpoint)")
    else:  # no labels: the teacher's embeddings are the targets
        task_data.set_targets(teacher)
    loaders = task_data.loaders(config.batch_size, config.seed)
    result = finetune(net, loaders["train"], loaders["validation"], task_data.spec, _work_dir(out), config=config,
                      resume=resume, teacher=teacher, progress=progress, log=log,
                      initial_candidate=converted and is_stage1_output(model))
    splits = [s for s in task_data.data if s != "train"]
    result = result.with_scores(scores(net, loaders, task_data.spec, splits, progress))
    on_main_process(save_model, net, task_data.processor, out, {"finetune.json": result.to_dict()})
    if not keep_work:
        on_main_process(remove_work_dir, _work_dir(out), out)
    return result


def check_teacher(teacher, spec, config):
    """A teacher is used (for the ``kd_weight`` term, or as an embedding task's targets), and with the
    head it was saved with: a checkpoint without the task's head would get a new one, at random,
    and be distilled from (transformers' load report the only sign)."""
    if spec.is_embedding:
        return
    if not config.kd_weight:
        raise LinearizeError(f"--teacher {teacher} is used only by the distillation term, and kd_weight is 0: add "
                             "--kd-weight A (0 < A <= 1), or drop --teacher")
    saved = source_config(teacher)
    if saved is not None and not getattr(saved, "linearize", None):  # a converted teacher is checked once loaded
        check_task_head(saved, f"the teacher {teacher}")
        check_head(saved, spec, f"the teacher {teacher}")


def is_stage1_output(model):
    """Whether ``model`` names a folder ``linearize distill`` wrote (it holds ``distill.json``)."""
    return isinstance(model, (str, Path)) and (Path(model) / DISTILL_RESULT).is_file()


def evaluate_model(model, task, *, data=None, head=None, batch_size=64, progress=False):
    """``{split: metrics}`` of a model (converted or not) on every labelled non-train split."""
    model = stage_model(model)
    config = single_stage_config(model, task, data, EvalConfig(batch_size=batch_size))
    task_data, net, converted = _stage_inputs(config, head)
    if task_data.spec.is_embedding:
        raise LinearizeError("an embedding model is scored against its teacher's embeddings: `linearize run "
                             "minilm-embeddings` (or `linearize finetune --task embeddings --teacher SOURCE`) "
                             "reports them")
    check_task_head(net, model)
    if not converted:
        check_trained_head(net, model)
    check_head(net, task_data.spec, model)
    check_label_order(net.config, task_data.spec, model)
    loaders = task_data.loaders(batch_size, 0)
    splits = [s for s in task_data.data if s != "train"]
    return {"task": task_data.spec.name, "converted": converted, "primary_metric": task_data.spec.primary_metric,
            "scores": scores(net, loaders, task_data.spec, splits, progress)}
