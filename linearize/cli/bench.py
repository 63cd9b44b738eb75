"""`linearize bench attention|long|folder`: speed and memory of linear attention against softmax,
side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..config import MeasureConfig
from ..errors import LinearizeError
from .common import app, console, friendly_errors, writing_output
from .config_options import config_options

bench_app = typer.Typer(
    name="bench",
    help="Speed and memory of linear attention against softmax, side by side: the attention layer "
         "(attention), whole models at long lengths (long), a converted model folder's crossover (folder).",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")

OutOpt = Annotated[Path, typer.Option("--out", "-O", help="Folder for bench.json, bench.md and bench.png.")]
LongOutOpt = Annotated[Path, typer.Option("--out", "-O", help="Folder for bench-long.json and bench-long.md.")]
SoftmaxMaxGibOpt = Annotated[Optional[float], typer.Option(
    help="Skip whole-model softmax where one layer's N×N matrices would pass this many GiB (default: half "
         "the machine's memory).")]


def _ints(text, option="--seq-lens"):
    """``"512,2048"`` -> ``(512, 2048)``; a bad list is a one-line error naming ``option``."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a comma-separated list of positive integers (example: "
                                 f"{option} 512,2048)") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{text!r}: give positive integers (example: {option} 512,2048)")
    return values


def _named(text, option):
    """A comma-separated ``--methods`` / ``--geometries`` value as given (None: the default); one that names
    nothing (``''``, ``','``) is a one-line error, not every default."""
    if text is not None and not text.replace(",", "").strip():
        raise typer.BadParameter(f"{option} {text!r} names nothing: give a comma-separated list, or leave {option} "
                                 "out for the default")
    return text


def _gib_bytes(gib):
    """``--softmax-max-gib`` in bytes; not above 0 (nothing would be measured) is one line."""
    if gib is not None and not gib > 0:
        raise typer.BadParameter(f"--softmax-max-gib {gib} skips softmax at every length, so there would be no "
                                 "crossover to measure: give a size in GiB above 0, or leave it out")
    return None if gib is None else int(gib * 2**30)


def _check_input_memory(seq_lens, batch_size, num_heads, head_dim, dtype):
    """The attention bench's q, k and v at the longest length must fit half this machine's memory:
    one line naming --seq-lens before they are allocated."""
    from ..machine import physical_memory

    memory, longest = physical_memory(), max(seq_lens)
    needed = 3 * batch_size * num_heads * longest * head_dim * (4 if dtype == "fp32" else 2)
    if memory and needed > memory / 2:
        raise typer.BadParameter(f"--seq-lens {longest:,}: q, k and v alone would take {needed / 2**30:,.1f} GiB, more "
                                 f"than half this machine's {memory / 2**30:,.1f} GiB; give shorter lengths")


@bench_app.command("attention")
@friendly_errors
@config_options(MeasureConfig, exclude=("processes", "compile_mode"), into="measure")
def attention_command(
    out: OutOpt = Path("runs/bench"),
    methods: Annotated[Optional[str], typer.Option(
        help="Comma-separated methods, each with options if wanted: "
             "'luna,luna(projections=16,shared_projections=false)' (default: all but softmax).")] = None,
    seq_lens: Annotated[Optional[str], typer.Option(
        help="Attention-layer sequence lengths (default 128,256,…,16384).")] = None,
    model: Annotated[Optional[str], typer.Option(
        help="Also time this whole model (folder, Hub id or alias, e.g. minilm); 'none' to skip. A converted "
             "folder's crossover: `linearize bench folder DIR`.")] = "minilm",
    model_seq_lens: Annotated[Optional[str], typer.Option(
        help="Whole-model sequence lengths (default 128,512).")] = None,
    num_heads: Annotated[int, typer.Option(help="Heads of the attention-layer benchmark.")] = 12,
    head_dim: Annotated[int, typer.Option(help="Head dimension of the attention-layer benchmark.")] = 32,
    measure: MeasureConfig = None,
):
    """Attention-layer and whole-model latency and peak memory: SDPA and eager softmax vs each method.

    Example: linearize bench attention --methods 'luna,luna(projections=16),hedgehog' --seq-lens 512,4096 --model minilm
    On a GPU: linearize bench attention --device cuda --dtype bf16 --seq-lens 512,2048,8192,32768 --model none
    """
    seq_lens = _ints(seq_lens) if seq_lens else None  # the arguments first: their errors answer before torch loads
    methods = _named(methods, "--methods")
    model_seq_lens = _ints(model_seq_lens, "--model-seq-lens") if model_seq_lens else None
    measure.check()
    from ..bench import DEFAULT_MODEL_SEQ_LENS, DEFAULT_SEQ_LENS, is_converted_folder, run_bench

    _check_input_memory(seq_lens or DEFAULT_SEQ_LENS, measure.batch_size, num_heads, head_dim, measure.dtype)

    if is_converted_folder(model):
        raise LinearizeError(f"{model} is a converted model folder: measure its crossover with "
                             f"`linearize bench folder {model}`")
    with writing_output(out):
        run_bench(out, methods=methods or None, seq_lens=seq_lens or DEFAULT_SEQ_LENS, num_heads=num_heads,
                  head_dim=head_dim, model=None if (model or "none").lower() == "none" else model,
                  model_seq_lens=model_seq_lens or DEFAULT_MODEL_SEQ_LENS, measure=measure,
                  log=console.print)  # it names the files it wrote


@bench_app.command("long")
@friendly_errors
@config_options(MeasureConfig, into="measure")
def long_command(
    out: LongOutOpt = Path("runs/bench"),
    methods: Annotated[Optional[str], typer.Option(
        help="Comma-separated methods, each with options if wanted: "
             "'luna,luna(projections=16,shared_projections=false)' (default: the recipe's LUNA, luna, hedgehog, "
             "t2r, darkformer, performer, flexformer-n).")] = None,
    seq_lens: Annotated[Optional[str], typer.Option(
        help="Whole-model sequence lengths (default 512,2048,4096,8192,16384).")] = None,
    geometries: Annotated[str, typer.Option(
        help="Models to measure: minilm (positions extended), modernbert-base (random weights), "
             "or folders / Hub ids.")] = "minilm,modernbert-base",
    convert_sliding_window: Annotated[bool, typer.Option(
        "--convert-sliding-window", help="Convert sliding-window layers too (ModernBERT's local layers, to "
                                         "windowed linear attention); by default they stay softmax.")] = False,
    softmax_max_gib: SoftmaxMaxGibOpt = None,
    measure: MeasureConfig = None,
):
    """Whole models at long lengths against softmax SDPA (writes bench-long.json and bench-long.md).

    Example: linearize bench long --geometries minilm --out runs/bench-long
    """
    lengths = {"seq_lens": _ints(seq_lens)} if seq_lens else {}
    methods, geometries = _named(methods, "--methods"), _named(geometries, "--geometries")
    measure.check()
    softmax_max_bytes = _gib_bytes(softmax_max_gib)
    from ..bench import run_long_bench  # after the arguments' checks: they answer before torch loads

    with writing_output(out):
        run_long_bench(out, geometries=[g.strip() for g in geometries.split(",") if g.strip()],
                       methods=methods or None, softmax_max_bytes=softmax_max_bytes,
                       convert_sliding_window=convert_sliding_window, **lengths, measure=measure,
                       log=console.print)  # it names the files it wrote


@bench_app.command("folder")
@friendly_errors
@config_options(MeasureConfig, into="measure")
def folder_command(
    directory: Annotated[Path, typer.Argument(help="A converted model folder (linearize convert's output; a run folder: "
                                                        "its model/).")],
    seq_lens: Annotated[Optional[str], typer.Option(
        help="Whole-model sequence lengths (default 128,512,2048).")] = None,
    softmax_max_gib: SoftmaxMaxGibOpt = None,
    measure: MeasureConfig = None,
):
    """A converted model folder against its softmax original: its crossover, written to DIR/bench.json.

    `linearize info DIR` and the model card (`linearize push`) state it.

    Example: linearize bench folder runs/minilm-hh-4k
    """
    from ..convert.loading import FOLDER_BENCH_JSON, converted_folder
    from ..outputs import check_writable_inside

    lengths = {"seq_lens": _ints(seq_lens)} if seq_lens else {}
    measure.check()
    directory = converted_folder(directory)  # a run folder's model/; not a converted folder: one line before torch
    check_writable_inside(directory, FOLDER_BENCH_JSON)  # nor one bench.json cannot be written into
    softmax_max_bytes = _gib_bytes(softmax_max_gib)
    from ..bench import bench_folder

    with writing_output(directory, option="DIR"):  # a second bench (or convert --overwrite) of DIR waits its turn
        bench_folder(directory, softmax_max_bytes=softmax_max_bytes, **lengths, measure=measure, log=console.print)
