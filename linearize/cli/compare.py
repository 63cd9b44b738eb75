"""`linearize compare`: the method comparison table on one task."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import LinearizeError
from .common import ThreadsOpt, app, check_method_names, console, friendly_errors, int_list, set_threads, writing_output
from .run import SetOpt


def _names_some(values, option, text, what, example):
    """``values`` parsed from ``option``'s ``text``, refused in one line when it names none."""
    if not values:
        raise LinearizeError(f"{option} {text!r} names no {what}: give comma-separated {what}s (example: {example})")
    return values


@app.command("compare")
@friendly_errors
def compare_command(
    recipe: Annotated[Optional[str], typer.Argument(help="Recipe (default minilm-moviereviews) or YAML file.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-O", help="Folder (default runs/compare-<recipe>).")] = None,
    methods: Annotated[Optional[str], typer.Option(
        help="Comma-separated methods (default: every method `linearize methods` lists but relu and softmax).",
        show_default=False)] = None,
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds.")] = "0,1,2",
    without_stage1: Annotated[bool, typer.Option(
        "--without-stage1/--no-without-stage1", help="Also run each learnable method without stage 1.")] = True,
    variant: Annotated[Optional[list[str]], typer.Option(
        help="A row setting 'NAME: key=value ...' (repeatable): every method runs once per variant, e.g. "
             "--variant plain --variant 'stage 1 x3: stage1.epochs=3'.")] = None,
    teachers_from: Annotated[Optional[Path], typer.Option(
        help="Reuse the teachers of another compare folder (its seed<N>/ runs) instead of fine-tuning new ones.")] = None,
    table_only: Annotated[bool, typer.Option(
        "--table-only", help="Run nothing: tabulate the finished runs in --out (the others are listed).")] = False,
    set_: SetOpt = None,
    quick: Annotated[bool, typer.Option("--quick", help="The recipe's quick version (a smoke test).")] = False,
    threads: ThreadsOpt = None,
):
    """Run several methods with the same budget and seeds; write compare.md / compare.json.

    Finished runs in --out are reused: re-running continues an interrupted comparison.
    Example: linearize compare --methods luna,hedgehog,t2r --seeds 0,1,2
    """
    from ..recipes import check_option_blocks, load_recipe, parse_set

    names = [name.strip() for name in (methods or "").split(",") if name.strip()]
    if methods is not None:
        _names_some(names, "--methods", methods, "method", "luna,hedgehog; leave --methods out for every method")
    seed_list = _names_some(int_list(seeds, "--seeds", "seeds", "0,1,2"), "--seeds", seeds, "seed", "0,1,2")
    check_method_names(*names)
    set_threads(threads)
    overrides = parse_set(set_)
    resolved = load_recipe(recipe, overrides=overrides, quick=quick)
    from ..attention.feature_maps import default_comparison  # torch: loaded by the recipe's checks by now

    check_option_blocks(overrides, names or default_comparison())
    out = out or Path("runs") / f"compare-{resolved.name}{'-quick' if quick else ''}"
    with writing_output(out):
        from ..compare import compare, render, variant_settings  # after the recipe's checks

        table = compare(resolved, out, methods=names or None, seeds=seed_list, without_stage1=without_stage1,
                        settings=variant_settings(variant) if variant else None,
                        teachers_from=teachers_from, table_only=table_only, log=console.print)
    console.print(render(table))
    console.print(f"written to {out / 'compare.md'}")
