"""`linearize convert`, `linearize info`, `linearize methods`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..config import HybridConfig, PositionsConfig, SlidingWindowConfig
from ..errors import LinearizeError
from ..recipes import parse_options
from .common import (HeadDimOpt, LayersOpt, MethodOpt, NumHeadsOpt, OptionOpt, app, check_method_names, console,
                     err_console, friendly_errors, parse_layers, writing_output)
from .config_options import config_options


@app.command("methods")
@friendly_errors
def methods_command(
    head_dim: HeadDimOpt = 64,
    num_heads: NumHeadsOpt = 12,
    option: OptionOpt = None,
):
    """List the attention methods: name, paper, feature size and learned parameters per layer.

    Example: linearize methods --head-dim 32 --num-heads 12
    """
    from ..attention import method_options, methods
    from ..convert.memory import check_feature_map_memory, map_bytes, meta_feature_map

    options = parse_options(option)
    every_option = {key for name in methods() for key in method_options(name)}
    unknown = sorted(set(options) - every_option)
    if unknown:
        raise LinearizeError(f"unknown option(s) {', '.join(unknown)}; valid options: {', '.join(sorted(every_option))}")
    table = Table(title=f"linearize methods (head_dim={head_dim}, num_heads={num_heads})")
    options_column = "options (with -o)" if options else "options (defaults)"
    for column in ("method", "paper", "feature dim", "learned params / layer", options_column):
        table.add_column(column, overflow="fold")
    for name in methods():
        mine = {k: v for k, v in options.items() if k in method_options(name)}
        # sized on the meta device, never allocated: a huge option is refused as convert refuses it (fp32)
        fm = meta_feature_map(name, head_dim, num_heads, mine)
        check_feature_map_memory(name, map_bytes(fm, 4), 1, mine)
        feature_dim = "exact" if fm.exact_softmax else str(fm.feature_dim)
        opts = ", ".join(f"{k}={option_text(v)}" for k, v in {**method_options(name), **mine}.items())
        table.add_row(name, fm.paper, feature_dim, f"{fm.num_learnable_parameters():,}", opts or "-")
    console.print(table)


def option_text(value):
    """An option's default as one types it (``--option shared_mlp=false``); None: chosen from the geometry."""
    if isinstance(value, bool):
        return str(value).lower()
    return "auto" if value is None else str(value)


@app.command("convert")
@friendly_errors
@config_options(PositionsConfig, into="positions")
@config_options(SlidingWindowConfig, into="sliding")
@config_options(HybridConfig, into="hybrid")
def convert_command(
    model: Annotated[str, typer.Argument(help="A local model folder, a Hub id, or an alias (bert-base, roberta-base, "
                                              "vit-base, minilm).")],
    out: Annotated[Path, typer.Option("--out", "-O", help="Folder to write the converted model to.")],
    method: MethodOpt = "luna",
    layers: LayersOpt = None,
    option: OptionOpt = None,
    overwrite: Annotated[bool, typer.Option(help="Replace --out if it exists and is not empty.")] = False,
    allow_pickle: Annotated[bool, typer.Option(
        help="Allow loading pickled .bin weights (can run code; only for sources you trust).")] = False,
    head: Annotated[Optional[str], typer.Option(
        help="Load this task head instead of the checkpoint's own: base, sequence-classification, "
             "token-classification, masked-lm, image-classification, question-answering.")] = None,
    num_labels: Annotated[Optional[int], typer.Option(help="Number of labels of a new classification head.")] = None,
    positions: PositionsConfig = None,
    sliding: SlidingWindowConfig = None,
    hybrid: HybridConfig = None,
):
    """Convert a pretrained encoder's softmax attention to linear attention and save it.

    Example: linearize convert minilm --method luna --out runs/minilm-luna
    Longer inputs: linearize convert minilm --method hedgehog --max-length 4096 --out runs/minilm-hh-4k
    Larger images: linearize convert vit-base --method hedgehog --image-size 384 --out runs/vit-hh-384
    ModernBERT's local layers too: linearize convert MODEL --method hedgehog --convert-sliding-window --out DIR
    Hybrid (exact softmax over blocks of 32 tokens and their neighbours, and on [CLS]): linearize convert minilm
    --method hedgehog --window 32 --sinks first --out runs/minilm-hh-w32
    """
    from ..convert.loading import check_source

    layers, options = parse_layers(layers), parse_options(option)
    check_method_names(method)  # a mistyped method, name or folder is one line before torch loads
    check_source(model, allow_pickle=allow_pickle)
    with writing_output(out):
        from ..convert import convert_checkpoint

        info = convert_checkpoint(model, method, out, layers=layers, options=options, overwrite=overwrite,
                                  allow_pickle=allow_pickle, head=head, num_labels=num_labels,
                                  **positions.to_dict(), **sliding.to_dict(), **hybrid.to_dict())
    print_summary(info)


@app.command("info")
@friendly_errors
def info_command(
    directory: Annotated[Optional[Path], typer.Argument(help="A converted model folder (or a run folder: its model/).",
                                                          show_default=False)] = None,
    env: Annotated[bool, typer.Option("--env", help="Show the installed versions of torch, transformers, ... "
                                                    "against the ones linearize was tested with.")] = False,
):
    """Show what a converted model is: method, options, converted layers, parameter overhead, and
    the crossover against softmax `linearize bench folder DIR` measured (with the machine).

    Example: linearize info runs/minilm-luna
    The installed versions against the tested ones: linearize info --env
    """
    from ..convert.loading import converted_folder

    if directory is not None:  # not a converted folder: one line before torch loads (and before --env's table)
        directory = converted_folder(directory)  # the folder itself, or a run folder's model/
    if env:
        print_environment()
    if directory is None:
        if env:
            return
        raise LinearizeError("give a converted model folder (linearize info DIR), or --env for the installed "
                             "versions")
    from ..bench import folder_speed_lines, read_folder_bench
    from ..convert import summary

    info = summary(directory)
    speed = read_folder_bench(directory)
    print_summary(info, speed=folder_speed_lines(speed) if speed else None)


def print_environment():
    """The installed versions against the tested ones (``linearize.tested``), and a warning line
    for each that differs; reads package metadata only, so it answers without loading torch."""
    import platform

    from ..tested import untested_warnings, version_rows
    from ..version import __version__

    rows = version_rows()
    console.print(f"linearize {__version__}, Python {platform.python_version()}, {platform.platform()}",
                  highlight=False, soft_wrap=True)
    table = Table(title="installed and tested versions")
    for column in ("package", "installed", "tested"):
        table.add_column(column)
    for package, installed, tested, same in rows:
        mark = "" if same or installed is None else " [bold yellow](differs)[/]"
        table.add_row(package, (installed or "not installed") + mark, tested)
    console.print(table)
    for line in untested_warnings(rows):
        err_console.print(f"[bold yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)


def _attention_kind(info):
    """How the converted layers attend: linear, or hybrid with its window and sinks."""
    from ..attention.hybrid import describe

    return describe(info["method"], info.get("window") or 0, info.get("sinks") or (), info.get("hybrid_layers"))


def print_summary(info, speed=None):
    """The summary table; ``speed``: ``{row name: text}`` of a measured crossover, else a hint."""
    table = Table(show_header=False, title=f"linearize model: {info['directory']}")
    layers = info["layers"]
    total = info["num_attention_layers"]
    rows = [
        ("architecture", f"{info['architecture']} ({info['base_model_type']})"),
        ("method", info["method"]),
        ("options", ", ".join(f"{k}={v}" for k, v in info["options"].items()) or "defaults"),
        ("converted layers", f"{len(layers)} of {total}: {layers}" + ("" if len(layers) == total else " (others softmax)")),
        ("attention", _attention_kind(info)),
        ("source", str(info["source"])),
        ("parameters added", f"{info['parameters_added']:,} ({info['parameters_added_percent']:.3f}% of "
                             f"{info['parameters_base']:,})"),
    ]
    local = [index for index in info.get("sliding_window_layers") or [] if index not in layers]
    if local:
        rows.append(("sliding-window layers", f"{local} stay windowed softmax"))
    if info.get("max_length"):
        rows.append(("positions", f"{info['max_length']:,} tokens ({info['position_init']})"))
    if info.get("image_size"):
        rows.append(("image size", f"{info['image_size']}×{info['image_size']} pixels"))
    if speed is not None:
        rows += list(speed.items())
    else:
        rows.append(("crossover", f"not measured: run `linearize bench folder {info['directory']}`"))
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


