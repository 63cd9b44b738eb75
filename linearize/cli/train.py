"""`linearize distill` (stage 1) and `linearize finetune` (stage 2, or a softmax teacher)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..recipes import parse_options
from . import (DataDirOpt, LabelColumnOpt, LayersOpt, MaxLengthOpt, OptionOpt, TaskOpt, TestFileOpt,
               TextColumnOpt, TextPairColumnOpt, TrainFileOpt, ValidationFileOpt, app, console, data_options,
               friendly_errors, parse_layers, print_scores)

ModelArg = Annotated[str, typer.Argument(help="A converted model folder, or a checkpoint (folder, Hub id, alias).")]
OutOpt = Annotated[Path, typer.Option("--out", "-O", help="Folder to write the trained model to.")]
OverwriteOpt = Annotated[bool, typer.Option(help="Replace --out if it exists and is not empty.")]
ResumeOpt = Annotated[bool, typer.Option(
    "--resume/--no-resume", help="Checkpoints are kept in <out>.work while training: --resume (default) continues an "
                                 "interrupted run from its last checkpoint, with the same result as an uninterrupted "
                                 "run; --no-resume deletes them and starts afresh.")]
MixedPrecisionOpt = Annotated[str, typer.Option(help="no | fp16 (GPU only) | bf16 (accelerate mixed precision).")]


@app.command("distill")
@friendly_errors
def distill_command(
    model: ModelArg,
    out: OutOpt,
    task: TaskOpt = "moviereviews",
    method: Annotated[Optional[str], typer.Option(help="Convert an unconverted MODEL with this method first.")] = None,
    layers: LayersOpt = None,
    option: OptionOpt = None,
    lr: Annotated[float, typer.Option(help="AdamW learning rate of the feature maps.")] = 1e-3,
    epochs: Annotated[float, typer.Option(help="Passes over the training text.")] = 1.0,
    max_steps: Annotated[Optional[int], typer.Option(help="Stop after this many steps.")] = None,
    batch_size: Annotated[int, typer.Option(help="Batch size.")] = 32,
    scheduler: Annotated[str, typer.Option(help="cosine | linear | constant.")] = "cosine",
    output_loss_weight: Annotated[float, typer.Option(
        help="Weight of an attention-output MSE term beside the cross-entropy (0 = off).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    gradient_accumulation_steps: Annotated[int, typer.Option(
        help="Batches per optimizer step (effective batch = batch size × this × processes).")] = 1,
    checkpoint_every: Annotated[int, typer.Option(
        help="Save a resumable checkpoint every N optimizer steps (and at the end; 0 = only at the end).")] = 100,
    mixed_precision: MixedPrecisionOpt = "no",
    resume: ResumeOpt = True,
    data_dir: DataDirOpt = None, train_file: TrainFileOpt = None, validation_file: ValidationFileOpt = None,
    test_file: TestFileOpt = None, text_column: TextColumnOpt = "text", text_pair_column: TextPairColumnOpt = None,
    label_column: LabelColumnOpt = None, max_length: MaxLengthOpt = 128,
    overwrite: OverwriteOpt = False,
):
    """Stage 1: train only the feature maps to reproduce the softmax attention rows.

    Example: linearize distill runs/minilm-luna --task moviereviews --out runs/minilm-luna-s1
    """
    from ..distill import DistillConfig
    from ..pipeline import distill_model

    config = DistillConfig(lr=lr, epochs=epochs, max_steps=max_steps, scheduler=scheduler,
                           output_loss_weight=output_loss_weight, seed=seed,
                           gradient_accumulation_steps=gradient_accumulation_steps, checkpoint_every=checkpoint_every,
                           mixed_precision=mixed_precision)
    data = data_options(data_dir, train_file, validation_file, test_file, text_column, text_pair_column,
                        label_column, max_length)
    result = distill_model(model, task, out, method=method, options=parse_options(option),
                           layers=parse_layers(layers), config=config, batch_size=batch_size, data=data,
                           overwrite=overwrite, resume=resume, log=console.print)
    from rich.table import Table

    table = Table(title="attention distance to the teacher per layer (dev split)")
    for column in ("layer", "CE before", "CE after", "KL before", "KL after"):
        table.add_column(column, justify="right")
    for layer, after in result["per_layer_after"].items():
        before = result["per_layer_before"][layer]
        table.add_row(str(layer), f"{before['ce']:.3f}", f"{after['ce']:.3f}", f"{before['kl']:.3f}",
                      f"{after['kl']:.3f}")
    console.print(table)
    console.print(f"saved to {out}")


@app.command("finetune")
@friendly_errors
def finetune_command(
    model: ModelArg,
    out: OutOpt,
    task: TaskOpt = "moviereviews",
    recipe: Annotated[str, typer.Option(help="Defaults: glue (LUNA: batch 8, lr 1e-5, 10 epochs, patience 3) or "
                                             "vit (cosine, warmup, weight decay 0.05).")] = "glue",
    lr: Annotated[Optional[float], typer.Option(help="AdamW learning rate.")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="Batch size.")] = None,
    epochs: Annotated[Optional[float], typer.Option(help="Maximum epochs.")] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Stop after this many steps.")] = None,
    weight_decay: Annotated[Optional[float], typer.Option(help="AdamW weight decay.")] = None,
    scheduler: Annotated[Optional[str], typer.Option(help="linear | cosine | constant.")] = None,
    warmup_ratio: Annotated[Optional[float], typer.Option(help="Fraction of warmup steps.")] = None,
    patience: Annotated[Optional[int], typer.Option(help="Early-stopping patience in epochs (0 = off).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    gradient_accumulation_steps: Annotated[Optional[int], typer.Option(
        help="Batches per optimizer step (effective batch = batch size × this × processes; default 1).")] = None,
    checkpoint_every: Annotated[Optional[int], typer.Option(
        help="Save a resumable checkpoint every N optimizer steps (and at every epoch end; 0 = epoch ends only; "
             "default 200).")] = None,
    mixed_precision: Annotated[Optional[str], typer.Option(
        help="no | fp16 (GPU only) | bf16 (accelerate mixed precision; default no).")] = None,
    resume: ResumeOpt = True,
    teacher: Annotated[Optional[str], typer.Option(
        help="The softmax teacher (folder or checkpoint with the task's head) for --kd-weight.")] = None,
    kd_weight: Annotated[Optional[float], typer.Option(
        help="Weight a of distillation toward --teacher's outputs: loss = (1-a)*task + a*KD (default 0).")] = None,
    kd_temperature: Annotated[Optional[float], typer.Option(help="Temperature of that term (default 2).")] = None,
    head: Annotated[Optional[str], typer.Option(help="Task head for an unconverted checkpoint.")] = None,
    data_dir: DataDirOpt = None, train_file: TrainFileOpt = None, validation_file: ValidationFileOpt = None,
    test_file: TestFileOpt = None, text_column: TextColumnOpt = "text", text_pair_column: TextPairColumnOpt = None,
    label_column: LabelColumnOpt = None, max_length: MaxLengthOpt = 128,
    overwrite: OverwriteOpt = False,
):
    """Stage 2: fine-tune the whole model on the task, keep the best dev checkpoint.

    The same command fine-tunes a plain softmax checkpoint: that is how a teacher is made.
    Example: linearize finetune minilm --task moviereviews --out runs/teacher --lr 5e-5 --epochs 3
    """
    from ..finetune import recipe as finetune_recipe
    from ..pipeline import finetune_model

    overrides = {k: v for k, v in dict(lr=lr, batch_size=batch_size, epochs=epochs, max_steps=max_steps,
                                       weight_decay=weight_decay, scheduler=scheduler, warmup_ratio=warmup_ratio,
                                       patience=patience, gradient_accumulation_steps=gradient_accumulation_steps,
                                       checkpoint_every=checkpoint_every, mixed_precision=mixed_precision,
                                       kd_weight=kd_weight, kd_temperature=kd_temperature).items()
                 if v is not None}
    config = finetune_recipe(recipe, seed=seed, **overrides)
    data = data_options(data_dir, train_file, validation_file, test_file, text_column, text_pair_column,
                        label_column, max_length)
    result = finetune_model(model, task, out, config=config, head=head, data=data, overwrite=overwrite,
                            resume=resume, teacher=teacher, log=console.print)
    print_scores(result["scores"], f"best checkpoint (epoch {result['best_epoch']}) on {task}")
    console.print(f"saved to {out}")
