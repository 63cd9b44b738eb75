"""`linearize run`: the whole pipeline from a recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..recipes import parse_options
from .common import (LayersOpt, OptionOpt, ThreadsOpt, TrainFileOpt, app, check_method_names, console,
                     friendly_errors, parse_layers, set_threads, writing_output)

SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", "-s", help="Override any recipe field: key.sub=value, e.g. stage1.lr=1e-2 (repeatable).")]


@app.command("run")
@friendly_errors
def run_command(
    recipe: Annotated[Optional[str], typer.Argument(
        help="A built-in recipe (minilm-moviereviews, minilm-longreviews, minilm-embeddings, vit-fashionmnist, "
             "bert-base-glue, roberta-base-glue, vit-base-imagenet) or a YAML file. Default: minilm-moviereviews.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-O", help="Run folder (default runs/<recipe>-<method>).")] = None,
    method: Annotated[Optional[str], typer.Option("--method", "-m", help="Override the recipe's method.")] = None,
    task: Annotated[Optional[str], typer.Option("--task", help="Override the recipe's task.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="Override the recipe's model.")] = None,
    train_file: TrainFileOpt = None,
    layers: LayersOpt = None,
    option: OptionOpt = None,
    seed: Annotated[Optional[int], typer.Option(help="Override the recipe's seed.")] = None,
    set_: SetOpt = None,
    quick: Annotated[bool, typer.Option("--quick", help="A ~2-minute smoke version of the recipe.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Delete --out first instead of resuming in it.")] = False,
    teacher_from: Annotated[Optional[Path], typer.Option(
        help="Reuse the fine-tuned teacher of this finished run folder (same model, task, data and seed).")] = None,
    report_to: Annotated[str, typer.Option(
        help="Experiment trackers for every training stage: tensorboard, wandb, mlflow, ... (comma-separated; the "
             "package must be installed), or none. Logs go to <out>/work/<stage>/logs.")] = "none",
    threads: ThreadsOpt = None,
):
    """Fine-tune the softmax teacher, convert, distill, fine-tune, evaluate and write the report.

    Runs again with the same --out resume after the last finished stage.

    Examples: linearize run --quick; linearize run vit-fashionmnist --method hedgehog;
    linearize run bert-base-glue --task mrpc --set data.data_dir=~/glue;
    linearize run minilm-embeddings --train-file my_sentences.txt
    """
    from ..recipes import check_option_blocks, load_recipe, parse_set

    check_method_names(method)  # the recipe's own method is checked when it loads
    set_threads(threads)
    overrides = parse_set(set_)
    for key, value in (("method", method), ("task", task), ("model", model), ("seed", seed)):
        if value is not None:
            overrides[key] = value
    if train_file is not None:
        overrides.setdefault("data", {})["train_file"] = str(train_file)
    if layers is not None:
        overrides["layers"] = parse_layers(layers)
    if option:
        overrides["options"] = parse_options(option)
    resolved = load_recipe(recipe, overrides=overrides, quick=quick)
    check_option_blocks(overrides, [resolved.method])
    out = out or Path("runs") / f"{resolved.name}-{resolved.method}{'-quick' if quick else ''}"
    with writing_output(out):
        from ..pipeline import run  # after the recipe's checks: they answer before torch loads

        report = run(resolved, out, overwrite=overwrite, log=console.print, teacher_from=teacher_from,
                     report_to=report_to)
    console.print(f"[bold]done:[/] {out}: {final_summary(report)}; see {out / 'report.md'}")


def final_summary(report):
    """The run's last line (after ``done: <out>:``): the student's recovery, and a warning when the
    teacher is at chance (``Report.chance_warning``): then the recovery says nothing."""
    recovery = report.recovery()
    if recovery.average is None:
        text = f"no student score on the {recovery.split} split, so the recovery is unknown"
    else:
        text = (f"student keeps {recovery.average:.1f}% of the teacher's {report.primary_metric} on the "
                f"{recovery.split} split")
    warning = report.chance_warning()
    return f"{text}, but {warning}" if warning else text
