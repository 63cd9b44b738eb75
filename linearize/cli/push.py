"""`linearize push`: publish a run or a converted model to the Hugging Face Hub."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from .common import app, console, friendly_errors


def _size(n):
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} GB"  # pragma: no cover


@app.command("push")
@friendly_errors
def push_command(
    directory: Annotated[Path, typer.Argument(help="A run folder (from `linearize run`) or a converted model folder.")],
    repo_id: Annotated[str, typer.Option("--repo-id", help="The Hub repo to push to: user/name (created if "
                                                           "missing).")],
    private: Annotated[bool, typer.Option("--private", help="Create the repo private (an existing repo keeps "
                                                            "its visibility).")] = False,
    revision: Annotated[Optional[str], typer.Option("--revision", help="Branch to push to (created if missing; "
                                                                       "default main).")] = None,
    token: Annotated[Optional[str], typer.Option("--token", help="Hugging Face token with write access (default: "
                                                                 "HF_TOKEN, else the cached `hf auth login`).",
                                                 show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would be uploaded; upload nothing.")] = False,
    no_report: Annotated[bool, typer.Option("--no-report", help="Push the model without a report.json (no "
                                                                "recovery table in the card).")] = False,
    commit_message: Annotated[Optional[str], typer.Option("--commit-message", help="The commit's summary "
                                                                                   "line.")] = None,
):
    """Push a converted model, its recovery report and a generated model card to the Hub.

    The endpoint is HF_ENDPOINT (default https://huggingface.co), so a private Hub mirror works.

    Example: linearize push runs/minilm-moviereviews-luna --repo-id me/minilm-luna --dry-run
    """
    from ..push import push

    result = push(directory, repo_id, private=private, revision=revision, token=token, dry_run=dry_run,
                  no_report=no_report, commit_message=commit_message)
    files = result["files"]
    total = sum(size for _, size in files)
    where = f"{result['endpoint']}/{result['repo_id']}"
    facts = f"revision {result['revision']}, private: {'yes' if result['private'] else 'no'}"
    table = Table(title="would upload" if result["dry_run"] else "uploaded")
    table.add_column("file", overflow="fold")
    table.add_column("size", justify="right")
    for name, size in files:
        table.add_row(escape(name), _size(size))
    table.add_row(f"{len(files)} files", _size(total))
    console.print(table)
    if result["dry_run"]:
        console.print(f"dry run: {len(files)} files ({_size(total)}) would be pushed to {escape(where)} "
                      f"({facts}); nothing was uploaded.", highlight=False, soft_wrap=True)
    else:
        console.print(f"pushed {len(files)} files ({_size(total)}) to {escape(result['url'])} ({facts}); "
                      f"commit: {escape(str(result.get('commit_url')))}", highlight=False, soft_wrap=True)
