"""Writing a run's report: ``report.json``, ``figures/*.png`` and ``report.md``, each atomically."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..outputs import atomic_path, atomic_write_json, atomic_write_text
from .figures import make_figures
from .markdown import render_markdown
from .results import FIGURES_DIR, REPORT_JSON, REPORT_MD, Report, as_report, validate_report


def save_report(report, run_dir):
    """Write ``report.json``, ``figures/*.png`` and ``report.md`` of the :class:`Report` into
    ``run_dir``; return the report with its ``figures`` set to those drawn."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    report = report.with_figures(make_figures(report, run_dir))
    atomic_write_json(run_dir / REPORT_JSON, report.to_json())
    atomic_write_text(run_dir / REPORT_MD, render_markdown(report))
    return report


def write_report(report, run_dir):
    """:func:`save_report` for a :class:`Report` or ``report.json``'s content as a dict (whose
    ``"figures"`` is then set to the figures drawn); return the paths written."""
    if not isinstance(report, Report):
        validate_report(report)
    saved = save_report(as_report(report), run_dir)
    if isinstance(report, dict):
        report["figures"] = list(saved.figures)
    run_dir = Path(run_dir)
    return [run_dir / REPORT_JSON, run_dir / REPORT_MD] + [run_dir / f for f in saved.figures]


def copy_report(run_dir, target_dir):
    """Copy the report files of ``run_dir`` (as :func:`write_report` left them) into ``target_dir``,
    each atomically; figures ``target_dir`` holds that ``run_dir`` does not are removed."""
    run_dir, target_dir = Path(run_dir), Path(target_dir)
    figures = {p.name for p in (run_dir / FIGURES_DIR).glob("*.png")}
    for stale in (target_dir / FIGURES_DIR).glob("*.png"):
        if stale.name not in figures:
            stale.unlink()
    for name in [REPORT_JSON, REPORT_MD] + [f"{FIGURES_DIR}/{figure}" for figure in sorted(figures)]:
        with atomic_path(target_dir / name) as tmp:
            shutil.copyfile(run_dir / name, tmp)


def render_report(run_dir):
    """Re-render ``report.md`` and the figures of ``run_dir`` (or of the given ``report.json``)."""
    path = Path(run_dir)
    report = Report.read(path)
    return write_report(report, path.parent if path.is_file() else path)
