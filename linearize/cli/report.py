"""`linearize report`: re-render a run's report.md and figures from its report.json."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import app, console, friendly_errors


@app.command("report")
@friendly_errors
def report_command(
    run_dir: Annotated[Path, typer.Argument(help="A run folder holding report.json (or the report.json itself).")],
):
    """Re-render a run's report.md and figures/ from its report.json (nothing is re-run).

    Example: linearize report runs/minilm-moviereviews-luna
    """
    from ..report import render_report

    written = render_report(run_dir)
    markdown = next(p for p in written if p.name == "report.md")
    figures = [p for p in written if p.suffix == ".png"]
    console.print(f"wrote {markdown}", highlight=False, soft_wrap=True)
    if figures:
        console.print(f"wrote {len(figures)} figure(s) in {figures[0].parent}: "
                      f"{', '.join(p.name for p in figures)}", highlight=False, soft_wrap=True)
