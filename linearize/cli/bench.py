"""`linearize bench`: speed and memory of linear attention against softmax, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import app, console, friendly_errors


def _ints(text):
    return tuple(int(part) for part in text.split(",") if part.strip())


@app.command("bench")
@friendly_errors
def bench_command(
    out: Annotated[Path, typer.Option("--out", "-O", help="Folder for bench.json, bench.md and bench.png.")] = Path(
        "runs/bench"),
    methods: Annotated[Optional[str], typer.Option(
        help="Comma-separated methods, each with options if wanted: "
             "'luna,luna(projections=16,shared_projections=false)' (default: all but softmax).")] = None,
    seq_lens: Annotated[str, typer.Option(help="Attention-layer sequence lengths.")] =
        "128,256,512,1024,2048,4096,8192,16384",
    model: Annotated[Optional[str], typer.Option(
        help="Also time this whole model (folder, Hub id or alias, e.g. minilm); 'none' to skip.")] = "minilm",
    model_seq_lens: Annotated[str, typer.Option(help="Whole-model sequence lengths.")] = "128,512",
    batch_size: Annotated[int, typer.Option(help="Batch size.")] = 1,
    num_heads: Annotated[int, typer.Option(help="Heads of the attention-layer benchmark.")] = 12,
    head_dim: Annotated[int, typer.Option(help="Head dimension of the attention-layer benchmark.")] = 32,
    threads: Annotated[Optional[int], typer.Option(help="torch threads (default: as configured).")] = None,
    repeats: Annotated[int, typer.Option(help="Timed repetitions per measurement (medians are reported).")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed warm-up repetitions.")] = 2,
    memory: Annotated[bool, typer.Option("--memory/--no-memory", help="Also measure peak extra memory.")] = True,
):
    """Attention-layer and whole-model latency and peak memory: SDPA and eager softmax vs each method.

    Example: linearize bench --methods 'luna,luna(projections=16),hedgehog' --seq-lens 512,4096 --model minilm
    """
    from ..bench import run_bench

    result = run_bench(out, methods=methods or None,
                       seq_lens=_ints(seq_lens), batch_size=batch_size, num_heads=num_heads, head_dim=head_dim,
                       threads=threads, repeats=repeats, warmup=warmup,
                       model=None if (model or "none").lower() == "none" else model,
                       model_seq_lens=_ints(model_seq_lens), memory=memory, log=console.print)
    console.print(f"written: {', '.join(str(f) for f in result.get('files', []))}")
