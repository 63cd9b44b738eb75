"""`linearize eval glue | text | image`: a model's official metrics on a task's held-out splits."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import (DataDirOpt, LabelColumnOpt, MaxLengthOpt, TestFileOpt, TextColumnOpt, TextPairColumnOpt,
               ThreadsOpt, TrainFileOpt, ValidationFileOpt, app, data_options, friendly_errors, print_scores,
               set_threads)

eval_app = typer.Typer(help="Evaluate a model (converted or softmax) on GLUE, text files or images.",
                       no_args_is_help=True)
app.add_typer(eval_app, name="eval")

ModelArg = Annotated[str, typer.Argument(help="A converted model folder, or a checkpoint (folder, Hub id, alias).")]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", help="Also write the scores to this JSON file.")]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="Evaluation batch size.")]


def _report(result, json_path):
    print_scores(result["scores"], f"{result['task']} ({'converted' if result['converted'] else 'softmax'} model)")
    if json_path is not None:
        from ..io import atomic_write_json
        from ..training import on_main_process

        on_main_process(atomic_write_json, json_path, result)


@eval_app.command("glue")
@friendly_errors
def eval_glue(
    model: ModelArg,
    task: Annotated[str, typer.Option("--task", help="cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte or wnli.")],
    data_dir: DataDirOpt = None,
    max_length: MaxLengthOpt = 128,
    batch_size: BatchOpt = 64,
    json_path: JsonOpt = None,
    threads: ThreadsOpt = None,
):
    """GLUE dev split with the official metric (MNLI: matched and mismatched).

    Example: linearize eval glue runs/bert-luna/model --task mrpc --data-dir ~/glue_data
    """
    from ..data import glue_task_name
    from ..pipeline import evaluate_model

    set_threads(threads)
    if glue_task_name(task) is None:
        from ..errors import LinearizeError

        raise LinearizeError(f"{task!r} is not a GLUE task; valid: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli")
    data = data_options(data_dir=data_dir, max_length=max_length)
    _report(evaluate_model(model, task, data=data, batch_size=batch_size, progress=True), json_path)


@eval_app.command("text")
@friendly_errors
def eval_text(
    model: ModelArg,
    task: Annotated[str, typer.Option("--task", help="moviereviews, files, or a Hub data set id.")] = "moviereviews",
    train_file: TrainFileOpt = None, validation_file: ValidationFileOpt = None, test_file: TestFileOpt = None,
    text_column: TextColumnOpt = "text", text_pair_column: TextPairColumnOpt = None,
    label_column: LabelColumnOpt = None, max_length: MaxLengthOpt = 128,
    batch_size: BatchOpt = 64,
    json_path: JsonOpt = None,
    threads: ThreadsOpt = None,
):
    """Text classification on the movie reviews, local files or a Hub data set (dev and test splits).

    Example: linearize eval text runs/minilm-moviereviews-luna/model --task moviereviews
    """
    from ..pipeline import evaluate_model

    set_threads(threads)
    data = data_options(None, train_file, validation_file, test_file, text_column, text_pair_column, label_column,
                        max_length)
    _report(evaluate_model(model, task, data=data, batch_size=batch_size, progress=True), json_path)


@eval_app.command("image")
@friendly_errors
def eval_image(
    model: ModelArg,
    dataset: Annotated[str, typer.Option("--dataset", help="fashion-mnist, imagefolder or a Hub data set id.")],
    data_dir: DataDirOpt = None,
    batch_size: BatchOpt = 128,
    json_path: JsonOpt = None,
    threads: ThreadsOpt = None,
):
    """Image classification top-1 (and top-5 with more than five classes).

    Example: linearize eval image runs/vit-fashionmnist-luna/model --dataset fashion-mnist
    """
    from ..pipeline import evaluate_model

    set_threads(threads)
    data = {"data_dir": data_dir and str(data_dir)}
    _report(evaluate_model(model, dataset, data=data, batch_size=batch_size, progress=True), json_path)
