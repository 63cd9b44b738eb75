"""`linearize bench`: speed and memory of linear attention against softmax, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import LinearizeError
from . import ThreadsOpt, app, console, friendly_errors


def _ints(text):
    return tuple(int(part) for part in text.split(",") if part.strip())


@app.command("bench")
@friendly_errors
def bench_command(
    out: Annotated[Path, typer.Option("--out", "-O", help="Folder for bench.json, bench.md and bench.png.")] = Path(
        "runs/bench"),
    methods: Annotated[Optional[str], typer.Option(
        help="Comma-separated methods, each with options if wanted: "
             "'luna,luna(projections=16,shared_projections=false)' (default: all but softmax; with --long: the "
             "recipe's LUNA, luna, hedgehog, t2r, darkformer, performer, flexformer-n).")] = None,
    seq_lens: Annotated[Optional[str], typer.Option(
        help="Attention-layer sequence lengths (default 128,256,…,16384); with --long the whole-model lengths "
             "(default 512,2048,4096,8192,16384).")] = None,
    model: Annotated[Optional[str], typer.Option(
        help="Also time this whole model (folder, Hub id or alias, e.g. minilm); 'none' to skip. A converted "
             "folder is measured against its softmax original and the crossover written to DIR/bench.json.")] = "minilm",
    model_seq_lens: Annotated[Optional[str], typer.Option(
        help="Whole-model sequence lengths (default 128,512; for a converted folder 128,512,2048).")] = None,
    long: Annotated[bool, typer.Option("--long", help="Whole models at long lengths against softmax SDPA "
                                                      "(writes bench-long.json and bench-long.md).")] = False,
    geometries: Annotated[str, typer.Option(
        help="With --long: models to measure: minilm (positions extended), modernbert-base (random weights), "
             "or folders / Hub ids.")] = "minilm,modernbert-base",
    convert_sliding_window: Annotated[bool, typer.Option(
        "--convert-sliding-window", help="With --long: convert sliding-window layers too (ModernBERT's local "
                                         "layers, to windowed linear attention); by default they stay softmax.")] = False,
    softmax_max_gib: Annotated[Optional[float], typer.Option(
        help="Skip whole-model softmax where one layer's N×N matrices would pass this many GiB (default: half "
             "the machine's memory).")] = None,
    batch_size: Annotated[int, typer.Option(help="Batch size.")] = 1,
    num_heads: Annotated[int, typer.Option(help="Heads of the attention-layer benchmark.")] = 12,
    head_dim: Annotated[int, typer.Option(help="Head dimension of the attention-layer benchmark.")] = 32,
    threads: ThreadsOpt = None,
    device: Annotated[str, typer.Option(help="cpu or cuda (cuda:N): where models and attention run; on cuda SDPA's "
                                             "flash and memory-efficient kernels are timed too.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="fp32, bf16 or fp16 (fp16 on cuda only).")] = "fp32",
    repeats: Annotated[int, typer.Option(help="Timed repetitions per measurement (medians are reported).")] = 5,
    clock: Annotated[str, typer.Option(help="wall, or cpu: the process's CPU time (with --threads 1 it does not count "
                                             "time other processes take).")] = "wall",
    warmup: Annotated[int, typer.Option(help="Untimed warm-up repetitions.")] = 2,
    memory: Annotated[bool, typer.Option("--memory/--no-memory", help="Also measure peak extra memory.")] = True,
):
    """Attention-layer and whole-model latency and peak memory: SDPA and eager softmax vs each method.

    Example: linearize bench --methods 'luna,luna(projections=16),hedgehog' --seq-lens 512,4096 --model minilm
    Long inputs: linearize bench --long --out runs/bench-long
    On a GPU: linearize bench --device cuda --dtype bf16 --seq-lens 512,2048,8192,32768 --model none
    A converted model's crossover (shown by `linearize info`): linearize bench --model runs/minilm-hh-4k
    """
    from ..bench import DEFAULT_MODEL_SEQ_LENS, DEFAULT_SEQ_LENS, run_bench
    from ..model_bench import bench_folder, is_converted_folder, run_long_bench

    cap = None if softmax_max_gib is None else int(softmax_max_gib * 2**30)
    common = dict(batch_size=batch_size, threads=threads, repeats=repeats, warmup=warmup, memory=memory,
                  device=device, dtype=dtype, clock=clock, log=console.print)
    if convert_sliding_window and not long:
        raise LinearizeError("--convert-sliding-window applies to whole models at long lengths: add --long")
    if long:
        result = run_long_bench(out, geometries=[g.strip() for g in geometries.split(",") if g.strip()],
                                methods=methods or None, softmax_max_bytes=cap,
                                convert_sliding_window=convert_sliding_window,
                                **({"seq_lens": _ints(seq_lens)} if seq_lens else {}), **common)
    elif is_converted_folder(model):
        if methods:
            raise LinearizeError("--methods does not apply to a converted folder: it is measured with its own method")
        bench_folder(model, softmax_max_bytes=cap,
                     **({"seq_lens": _ints(model_seq_lens)} if model_seq_lens else {}), **common)
        return
    else:
        result = run_bench(out, methods=methods or None, seq_lens=_ints(seq_lens) if seq_lens else DEFAULT_SEQ_LENS,
                           num_heads=num_heads, head_dim=head_dim,
                           model=None if (model or "none").lower() == "none" else model,
                           model_seq_lens=_ints(model_seq_lens) if model_seq_lens else DEFAULT_MODEL_SEQ_LENS, **common)
    console.print(f"written: {', '.join(str(f) for f in result.get('files', {}).values())}")
