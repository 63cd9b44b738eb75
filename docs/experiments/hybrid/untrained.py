"""Recovery with no training at all (issue 34, item 2): a fine-tuned softmax teacher converted to each hybrid
variant, stage 1 and stage 2 skipped, γ at its measured start (``FeatureMap.initial_gamma``), scored on the
task's dev and test splits beside the teacher itself.

Each variant is a ``linearize convert`` of ``TEACHER`` (``convert_checkpoint``: the saved folder a user would
get) into ``--out/<variant>/``, scored with ``linearize eval text`` (``evaluate_model``); every score goes to
``--out/<variant>.json`` when it is done, so a re-run skips finished variants. The table (``untrained.md``,
``untrained.json``) is written atomically after every variant.

    PYTHONPATH=. python docs/experiments/hybrid/untrained.py runs/long-reviews/seed0/full/teacher \\
        --task moviereviews-long --max-length 2048 --out runs/untrained-long
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from linearize.config import DataConfig
from linearize.convert.api import convert_checkpoint
from linearize.markdown import markdown_table
from linearize.outputs import atomic_write_json, atomic_write_text
from linearize.pipeline import evaluate_model

#: (label, window R, sinks); R = 0 with no sinks is pure linear attention
VARIANTS = (("pure", 0, "none"), ("R=0 + first", 0, "first"), ("R=16 + first", 16, "first"),
            ("R=32", 32, "none"), ("R=32 + first", 32, "first"), ("R=64 + first", 64, "first"))


def slug(label):
    return label.replace(" ", "").replace("=", "").replace("+", "-")


def score(folder, args):
    data = DataConfig(max_length=args.max_length, max_eval_examples=args.max_eval_examples)
    return evaluate_model(str(folder), args.task, data=data, batch_size=args.batch_size, progress=False)["scores"]


def variant_scores(teacher, method, label, window, sinks, args):
    """The variant's ``{split: metrics}``, converted and scored now or read from its finished JSON."""
    done = args.out / f"{slug(label)}.json"
    if done.is_file():
        return json.loads(done.read_text())
    if label == "teacher":
        scores = score(teacher, args)
    else:
        folder = args.out / slug(label)
        convert_checkpoint(str(teacher), method, folder, overwrite=True, head="sequence-classification",
                           window=window, sinks=sinks)
        scores = score(folder, args)
    atomic_write_json(done, scores)
    return scores


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("teacher", type=Path, help="a fine-tuned softmax model folder (a run's teacher/)")
    parser.add_argument("--task", default="moviereviews-long")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--method", default="hedgehog")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-eval-examples", type=int, default=None, help="a smoke test: score only this many")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results, rows = {}, []
    for label, window, sinks in (("teacher", 0, "none"),) + VARIANTS:
        results[label] = variant_scores(args.teacher, args.method, label, window, sinks, args)
        teacher = results["teacher"]
        cells = [label]
        for split in ("validation", "test"):
            accuracy = results[label][split]["accuracy"]
            cells += [f"{accuracy:.3f}", f"{100 * accuracy / teacher[split]['accuracy']:.1f}"]
        rows.append(cells)
        print(" | ".join(cells), flush=True)
        table = markdown_table(["variant", "dev accuracy", "dev % of teacher", "test accuracy", "test % of teacher"],
                               rows)
        atomic_write_text(args.out / "untrained.md", f"{args.method}, {args.task} at {args.max_length} tokens, "
                          f"teacher {args.teacher}; no training (γ at its start)\n\n{table}\n")
        atomic_write_json(args.out / "untrained.json", {"teacher": str(args.teacher), "method": args.method,
                                                         "task": args.task, "max_length": args.max_length,
                                                         "scores": results})


if __name__ == "__main__":
    main()
