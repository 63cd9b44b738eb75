"""Time per review in a user's own process: a teacher and a student folder, each test review of
``moviereviews-long`` at its own length, in fresh processes that load both with plain transformers.

The run's own figure (``eval.latency_examples``, report.json ``latency.own_lengths``) is taken inside the
``linearize`` process, which tunes glibc's malloc. Here every process is the user's (as in
``linearize.bench.user_state``): linearize cannot be imported, glibc's default allocator, ``threads`` threads,
``torch.inference_mode()``; ``AutoModelForSequenceClassification.from_pretrained(folder,
trust_remote_code=True)`` for both. Each process times every review once with each model, batch 1, real
tokens only (the run's length rule: cut at 2,048), the first model alternating from review to review and the
first review of each process untimed; its figure is the student's total time ÷ the teacher's (the ratio of
the mean times per review, what the issue's target reads). Over ``--processes`` processes: the median and the
range. ``--cut 512`` gives the second folder each review cut at 512 tokens: the time of the teacher that reads
512 (the same network as the teacher at 2,048, on shorter inputs), with the teacher's own folder as the second.
Several student folders (two builds of one model, say) are timed in the same processes, every review with each
model in turn: the host's speed moves the ratio itself by a few hundredths from one round to the next on a small
shared machine, and this reaches all the folders alike.

    PYTHONPATH=. python docs/experiments/hybrid/per_review_user_state.py <teacher folder> <student folder> [...] \\
        --processes 5 --threads 2 --out docs/experiments/hybrid/per-review-user-state/<name>
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from linearize.bench.user_state import user_environment
from linearize.machine import machine_info
from linearize.outputs import atomic_write_json, atomic_write_text

CHILD = r"""
import json, sys, time
sys.modules["linearize"] = None  # the user's process: linearize is not installed there
import torch, transformers

spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
load = transformers.AutoModelForSequenceClassification.from_pretrained
models = {label: load(path, trust_remote_code=True).eval() for label, path in spec["folders"].items()}
reviews = json.loads(open(spec["reviews"]).read())
totals = {label: 0.0 for label in models}
with torch.inference_mode():
    for index, ids in enumerate(reviews):
        full = torch.tensor([ids])
        cut = torch.tensor([ids[:spec["cut"] - 1] + ids[-1:]]) if spec["cut"] and len(ids) > spec["cut"] else full
        order = list(models) if (index + spec["first"]) % 2 else list(models)[::-1]
        for label in order:
            inputs = {"input_ids": full if label == "teacher" else cut}
            inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
            start = time.perf_counter()
            models[label](**inputs)
            totals[label] += (time.perf_counter() - start) if index else 0.0  # review 0 warms up
print(json.dumps({"ms_per_review": {k: 1000 * v / (len(reviews) - 1) for k, v in totals.items()},
                  "linearize_loaded": sys.modules.get("linearize") is not None, "threads": torch.get_num_threads()}))
"""


def test_reviews(teacher, count):
    """The first ``count`` + 1 test reviews' token ids (real tokens, cut at the recipe's 2,048), in the order the
    run's report split is read."""
    from linearize.pipeline import TaskData
    from linearize.recipes import load_recipe

    recipe = load_recipe("minilm-longreviews").with_overrides({"model": str(teacher), "eval": {"batch_size": 8}})
    loader = TaskData.load(recipe).loaders(8, 0)["test"]
    reviews = []
    for batch in loader:
        for ids, real in zip(batch["input_ids"], batch["attention_mask"]):
            reviews.append(ids[real.bool()].tolist())
    return reviews[:count + 1]


def student_labels(students):
    """``student`` for one student folder; ``student 1``, ``student 2``... for several."""
    return ["student"] if len(students) == 1 else [f"student {index + 1}" for index in range(len(students))]


def measure(teacher, students, reviews_file, processes, threads, cut):
    runs = []
    for index in range(processes):
        folders = {"teacher": str(teacher), **dict(zip(student_labels(students), map(str, students)))}
        spec = {"folders": folders, "reviews": str(reviews_file), "threads": threads, "first": index % 2, "cut": cut}
        done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True,
                              env=user_environment(), check=True)
        run = json.loads(done.stdout.strip().splitlines()[-1])
        assert not run["linearize_loaded"] and run["threads"] == threads, run
        runs.append(run["ms_per_review"])
        print(f"process {index + 1}/{processes}: " + ", ".join(f"{label} {ms:.1f}" for label, ms in runs[-1].items())
              + " ms a review", flush=True)
    return runs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("teacher", type=Path)
    parser.add_argument("student", type=Path, nargs="+",
                        help="one student folder, or several: each process then times all of them, interleaved "
                             "review by review with the teacher, so a change of the host's speed reaches them alike")
    parser.add_argument("--reviews", type=int, default=300, help="test reviews timed per process")
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cut", type=int, default=0,
                        help="give the second folder each review cut to this many tokens (its last, [SEP], kept): "
                             "the teacher that reads 512 tokens is the same network on shorter inputs")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    reviews = test_reviews(args.teacher, args.reviews)
    with tempfile.TemporaryDirectory() as folder:
        reviews_file = Path(folder) / "reviews.json"
        reviews_file.write_text(json.dumps(reviews))
        runs = measure(args.teacher, args.student, reviews_file, args.processes, args.threads, args.cut)
    labels = student_labels(args.student)
    ratios = {label: [run[label] / run["teacher"] for run in runs] for label in labels}
    summary = {label: {"median": statistics.median(values), "lowest": min(values), "highest": max(values),
                       "per_process": values} for label, values in ratios.items()}
    result = {"teacher": str(args.teacher), "student": str(args.student[0]) if len(labels) == 1 else None,
              "students": dict(zip(labels, map(str, args.student))), "reviews": len(reviews) - 1,
              "mean_tokens": statistics.mean(len(ids) for ids in reviews[1:]), "threads": args.threads,
              "student_cut_at": args.cut or None, "processes": runs,
              "student_over_teacher": summary["student"] if len(labels) == 1 else summary, "machine": machine_info()}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "per-review.json", result)
    text = report(result, labels, ratios, summary, args)
    atomic_write_text(args.out / "per-review.md", text)
    print(text)


def report(result, labels, ratios, summary, args):
    """The markdown of :func:`main`'s result: a row per process, then each student's median and range."""
    runs = result["processes"]
    header = "| process | teacher (ms a review) | " + " | ".join(labels) + " | " + \
        " | ".join(f"{label} ÷ teacher" for label in labels) + " |\n|--:|" + "--:|" * (1 + 2 * len(labels)) + "\n"
    rows = "".join(f"| {i + 1} | {run['teacher']:.1f} | " + " | ".join(f"{run[label]:.1f}" for label in labels) + " | "
                   + " | ".join(f"{ratios[label][i]:.3f}" for label in labels) + " |\n" for i, run in enumerate(runs))
    folders = "".join(f"{label}: `{path}`. " for label, path in result["students"].items()) if len(labels) > 1 else ""
    medians = "".join(f"\n{label.capitalize()} ÷ teacher: median **{summary[label]['median']:.3f}** "
                      f"({summary[label]['lowest']:.3f}-{summary[label]['highest']:.3f}).\n" for label in labels)
    return (f"# Time per review in a user's process\n\n{result['reviews']} test reviews of moviereviews-long at their own "
            f"lengths ({result['mean_tokens']:.0f} tokens on average), batch 1, {args.threads} threads, "
            f"{len(runs)} fresh plain-transformers processes (default allocator, linearize not importable)."
            + (f" The student folders read each review cut at {args.cut} tokens." if args.cut else "")
            + (f" Each process times every folder, interleaved review by review. {folders}" if folders else "")
            + "\n\n" + header + rows + medians)


if __name__ == "__main__":
    main()
