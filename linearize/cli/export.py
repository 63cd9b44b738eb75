"""`linearize export`: a converted model as an ONNX graph with dynamic batch and sequence axes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from .common import app, console, friendly_errors


@app.command("export")
@friendly_errors
def export_command(
    directory: Annotated[Path, typer.Argument(help="A converted model folder (`linearize convert`), or a run folder "
                                                   "(`linearize run`: its model/).")],
    out: Annotated[Optional[Path], typer.Option(
        "--out", "-O", help="The file to write (default: model.onnx in the model folder; onnx/model.onnx in a "
                            "sentence-transformers folder).", show_default=False)] = None,
    format: Annotated[str, typer.Option("--format", help="Export format: onnx.")] = "onnx",
    check: Annotated[bool, typer.Option("--check/--no-check", help="Run the exported graph in onnxruntime against "
                                                                   "PyTorch at another batch size and length.")] = True,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out file.")] = False,
):
    """Export a converted model for inference outside PyTorch (ONNX Runtime, ...).

    Inputs: input_ids, attention_mask (and token_type_ids where the model has them), or pixel_values;
    output: the model's first output (logits or last_hidden_state). Batch and sequence length are dynamic.

    Example: linearize export runs/minilm-luna --format onnx --out minilm-luna.onnx
    """
    from ..convert.loading import converted_folder

    converted_folder(directory)  # not a converted model or run folder: one line before torch loads
    from ..export import CHECK_BATCH, CHECK_LENGTH, export

    result = export(directory, out, format=format, check=check, overwrite=overwrite, log=progress_line)
    console.print(f"wrote {escape(str(result['path']))}: inputs {', '.join(result['inputs'])} -> {result['output']}",
                  highlight=False, soft_wrap=True)
    if result["max_abs_difference"] is not None:
        tokens = "" if result["inputs"] == ["pixel_values"] else f", {CHECK_LENGTH} tokens with padding"
        console.print(f"onnxruntime vs PyTorch at batch {CHECK_BATCH}{tokens}: "
                      f"max |difference| {result['max_abs_difference']:.2e}", highlight=False)


def progress_line(line):
    """One progress line of the export (a path in it is printed as is, not as rich markup)."""
    console.print(escape(line), highlight=False, soft_wrap=True)
