"""`linearize distill` (stage 1) and `linearize finetune` (stage 2, or a softmax teacher)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..config import DataConfig, FinetuneConfig, HybridConfig, Stage1Config
from ..recipes import parse_options
from .common import (TEXT_DATA_FIELDS, LayersOpt, OptionOpt, TaskOpt, ThreadsOpt, app, check_arguments,
                     check_method_names, console, friendly_errors, parse_layers, print_scores, set_threads,
                     writing_output)
from .config_options import config_options

ModelArg = Annotated[str, typer.Argument(help="A converted model folder, or a checkpoint (folder, Hub id, alias).")]
OutOpt = Annotated[Path, typer.Option("--out", "-O", help="Folder to write the trained model to.")]
OverwriteOpt = Annotated[bool, typer.Option(help="Replace --out if it exists and is not empty.")]
ResumeOpt = Annotated[bool, typer.Option(
    "--resume/--no-resume", help="Checkpoints are kept in <out>.work while training: --resume (default) continues an "
                                 "interrupted run from its last checkpoint, with the same result as an uninterrupted "
                                 "run; --no-resume deletes them and starts afresh.")]

KeepWorkOpt = Annotated[bool, typer.Option(
    "--keep-work", help="Keep <out>.work (resume checkpoints, best weights) after success; by default it is "
                        "deleted and its metrics.jsonl moves into --out.")]


@app.command("distill")
@friendly_errors
@config_options(Stage1Config, exclude=("enabled",))
@config_options(DataConfig, include=TEXT_DATA_FIELDS, into="data")
@config_options(HybridConfig, unset_is_none=True, unset_help="in --method's conversion", into="hybrid")
def distill_command(
    model: ModelArg,
    out: OutOpt,
    task: TaskOpt = "moviereviews",
    method: Annotated[Optional[str], typer.Option(help="Convert an unconverted MODEL with this method first.")] = None,
    layers: LayersOpt = None,
    option: OptionOpt = None,
    resume: ResumeOpt = True,
    keep_work: KeepWorkOpt = False,
    overwrite: OverwriteOpt = False,
    threads: ThreadsOpt = None,
    config: Stage1Config = None,
    data: DataConfig = None,
    hybrid: dict = None,
):
    """Stage 1: train only the feature maps to reproduce the softmax attention rows.

    Example: linearize distill runs/minilm-luna --task moviereviews --out runs/minilm-luna-s1
    """
    options, layers = parse_options(option), parse_layers(layers)
    check_method_names(method)
    check_arguments(model, config, data)
    set_threads(threads)
    with writing_output(out):
        from ..pipeline import distill_model

        result = distill_model(model, task, out, method=method, options=options, layers=layers, hybrid=hybrid,
                               config=config, data=data, overwrite=overwrite, resume=resume, keep_work=keep_work,
                               log=console.print)
    from rich.table import Table

    table = Table(title="attention distance to the teacher per layer (dev split)")
    for column in ("layer", "CE before", "CE after", "KL before", "KL after"):
        table.add_column(column, justify="right")
    for layer, after in result.per_layer_after.items():
        before = result.per_layer_before[layer]
        table.add_row(str(layer), f"{before['ce']:.3f}", f"{after['ce']:.3f}", f"{before['kl']:.3f}",
                      f"{after['kl']:.3f}")
    console.print(table)
    console.print(f"saved to {out}")


@app.command("finetune")
@friendly_errors
@config_options(FinetuneConfig, unset_is_none=True, into="settings")
@config_options(DataConfig, include=TEXT_DATA_FIELDS, into="data")
def finetune_command(
    model: ModelArg,
    out: OutOpt,
    task: TaskOpt = "moviereviews",
    recipe: Annotated[str, typer.Option(help="Defaults: glue (LUNA: batch 8, lr 1e-5, 10 epochs, patience 3) or "
                                             "vit (cosine, warmup, weight decay 0.05).")] = "glue",
    resume: ResumeOpt = True,
    keep_work: KeepWorkOpt = False,
    teacher: Annotated[Optional[str], typer.Option(
        help="The softmax teacher (folder or checkpoint with the task's head) for --kd-weight.")] = None,
    head: Annotated[Optional[str], typer.Option(help="Task head for an unconverted checkpoint.")] = None,
    overwrite: OverwriteOpt = False,
    threads: ThreadsOpt = None,
    settings: dict = None,
    data: DataConfig = None,
):
    """Stage 2: fine-tune the whole model on the task, keep the best dev checkpoint.

    The same command fine-tunes a plain softmax checkpoint: that is how a teacher is made.
    Example: linearize finetune minilm --task moviereviews --out runs/teacher --lr 5e-5 --epochs 3
    """
    check_arguments(model, FinetuneConfig(**settings), data)
    from ..finetune import recipe as finetune_recipe
    from ..pipeline import finetune_model

    set_threads(threads)
    config = finetune_recipe(recipe, **settings)
    with writing_output(out):
        result = finetune_model(model, task, out, config=config, head=head, data=data, overwrite=overwrite,
                                resume=resume, teacher=teacher, keep_work=keep_work, log=console.print)
    kept = ": the stage-1 model as given, no epoch beat it on dev" if result.best_epoch == 0 else ""
    print_scores(result.scores, f"best checkpoint (epoch {result.best_epoch}{kept}) on {task}")
    console.print(f"saved to {out}")
