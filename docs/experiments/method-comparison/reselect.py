"""Recovery under the corrected model selection (issue 23), recomputed from stored numbers, no training.

Stage 2 used to pick its best epoch on the dev split among its own epochs only; now the stage-1
model competes as epoch 0 and is kept when no stage-2 epoch beats it on dev (a tie keeps it, the
earlier candidate). The old rule's stage-2 model is the best stage-2 epoch, so its dev score is
the best any stage-2 epoch reached, and the corrected choice of a run is

    the stage-1 model   if dev(stage 1) >= dev(stage-2 model kept by the old rule)
    the stage-2 model   otherwise.

The pipeline trains stage 2 exactly as before (it reuses the stage-1 dev score it already
measured, so no extra evaluation touches the random state), and with stage 2's one epoch (or
three with patience 3) early stopping cannot cut a run short, so this is what re-running the
same recipes and seeds gives.

    python docs/experiments/method-comparison/reselect.py runs/compare runs/levers ...
        every run folder ``<compare folder>/seed<N>/<run>/report.json``: per run folder name, the
        recovery on the report split under the old and the corrected selection (mean ± std over
        seeds) and how many seeds keep the stage-1 model. A run made under the corrected rule
        that kept its stage-1 model never scored stage 2's model on test: its old-rule figure is
        "unknown"
    python docs/experiments/method-comparison/reselect.py --default-run
        the seed-0 run in docs/experiments/default-run/RESULTS.md (its table's dev and test accuracies)
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

DEFAULT_RUN = Path(__file__).resolve().parents[1] / "default-run" / "RESULTS.md"


def corrected(stage1, stage2, metric, selection="validation", report="test"):
    """``(kept, score on the report split)``: ``stage1``/``stage2`` are ``{split: {metric: value}}``."""
    if stage1[selection][metric] >= stage2[selection][metric]:
        return "stage 1", stage1[report][metric]
    return "stage 2", stage2[report][metric]


def _cell(values):
    if any(v is None for v in values):
        known = [v for v in values if v is not None]
        return (_cell(known) + ", " if known else "") + f"{len(values) - len(known)} unknown"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values):.1f} ({', '.join(f'{v:.1f}' for v in values)})"


def from_reports(folders):
    """The table over every finished run under the compare ``folders``."""
    from linearize.report import load_report

    rows = defaultdict(lambda: {"old": [], "new": [], "kept": 0})
    for folder in folders:
        for path in sorted(Path(folder).glob("seed*/*/report.json")):
            report = load_report(path.parent)
            metric, split = report.primary_metric, report.split
            teacher = report.scores_of("teacher")[metric]
            student = report.scores["student"]
            if report.attention.stage1_skipped or "student_stage1" not in report.scores:
                kept, score = "stage 2", student[split][metric]  # no stage 1: nothing competes
            else:
                kept, score = corrected(report.scores["student_stage1"], student, metric, report=split)
            row = rows[f"{Path(folder).name}/{path.parent.name}"]
            if report.selection.stage1_kept:
                row["old"].append(None)  # made under the corrected rule: stage 2's own model was not scored on test
            else:
                row["old"].append(100 * student[split][metric] / teacher)
            row["new"].append(100 * score / teacher)
            row["kept"] += kept == "stage 1"
    print("| run | recovery %, old selection | recovery %, corrected selection | seeds keeping stage 1 |")
    print("|:--|--:|--:|--:|")
    for name, row in rows.items():
        print(f"| {name} | {_cell(row['old'])} | {_cell(row['new'])} | {row['kept']} of {len(row['old'])} |")


def from_default_run(path=DEFAULT_RUN):
    """The seed-0 run whose dev and test accuracies docs/experiments/default-run/RESULTS.md tabulates."""
    found = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        numbers = [c for c in cells[1:3] if re.fullmatch(r"\d+\.\d+", c)]
        keys = [key for key, label in (("teacher", "teacher"), ("stage1", "after stage 1"),
                                       ("stage2", "after stage 2")) if label in cells[0]]
        if len(numbers) == 2 and keys:  # not the corrected row itself
            found[keys[0]] = {"validation": {"accuracy": float(numbers[0])}, "test": {"accuracy": float(numbers[1])}}
    teacher = found["teacher"]["test"]["accuracy"]
    kept, score = corrected(found["stage1"], found["stage2"], "accuracy")
    old = found["stage2"]["test"]["accuracy"]
    print(f"dev: stage 1 {found['stage1']['validation']['accuracy']:.3f}, "
          f"stage 2 {found['stage2']['validation']['accuracy']:.3f} -> kept: {kept}")
    print(f"recovery (test): old {100 * old / teacher:.1f}%, corrected {100 * score / teacher:.1f}% "
          f"(test accuracy {score:.3f} of the teacher's {teacher:.3f})")


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args == ["--default-run"]:
        from_default_run()
    else:
        from_reports(args)
