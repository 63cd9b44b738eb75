"""Whole movie reviews side by side (issue 19, item 5): what reading a review whole buys, and what
the linear student keeps of it at a fraction of the cost.

Per seed, on the test split of ``moviereviews-long`` (Pang & Lee's 1,500 whole reviews), with the
recipe ``minilm-longreviews`` (all-MiniLM-L6-v2, positions extended to ``data.max_length``):

- (a) the softmax teacher cut at ``--truncate`` tokens (512: MiniLM's own positions): the
  recipe's teacher stage alone at that length (``linearize.pipeline.run_teacher``);
- (b) the softmax teacher at the recipe's full length, positions extended (quadratic attention),
  and (c) the linear student converted from it: one ``linearize run`` of the recipe.

Reported: accuracy of (a), (b), (c); the recovery of (c) against (b) (the run's own, student ÷
teacher × 100); (a) against (b); and the whole-model forward time per test review of (b) and (c):
batch 1, each review at its own tokenised length (≤ ``data.max_length``, no padding), the two
models interleaved review by review in alternating order after one untimed warm-up review, on
``--device`` (default cpu) with ``--threads`` threads. Each run's own latency at exactly
``data.max_length`` tokens is kept too. Mean ± std over seeds (the training seed; the data split is
the recipe's ``data.seed``, the same for every seed, as in ``linearize compare``).

Written atomically into ``--out``: ``seed<N>/result.json`` when a seed is finished (a finished
seed is never run again; an unfinished one resumes inside its runs), and after every seed the
table of the finished ones, ``long-reviews.json`` and ``long-reviews.md``.

    PYTHONPATH=. python docs/experiments/long-reviews/measure.py --out runs/long-reviews   # 3 seeds
    PYTHONPATH=. OMP_NUM_THREADS=1 python docs/experiments/long-reviews/measure.py --quick \\
        --out runs/long-reviews-quick --seeds 0          # smoke test: the recipe's quick block, (a) at 128
    PYTHONPATH=. python docs/experiments/long-reviews/measure.py --out runs/long-reviews-hybrid32 \\
        --teachers-from runs/long-reviews --set hybrid.window=32 --set hybrid.sinks=first   # a variant: students only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from linearize.allocator import keep_freed_memory
from linearize.errors import LinearizeError
from linearize.outputs import atomic_write_json, atomic_write_text
from linearize.pipeline import TaskData, load_saved, run, run_teacher
from linearize.recipes import load_recipe, parse_set

RECIPE = "minilm-longreviews"
QUICK_TRUNCATE = 128  # --quick's (a): shorter than the quick block's 576 tokens, as 512 is than 2,048


def measure_seed(recipe, seed, out, *, truncate, device="cpu", max_reviews=None, progress=True, log=print,
                 teachers_from=None):
    """Seed ``seed``'s row of every column (``out/seed<N>/result.json``, reused when there).
    ``teachers_from``: another study's ``--out`` whose seed folders hold finished teachers (a) and (b)
    of the same recipe: they are reused (``linearize run --teacher-from``), only the student trains. A teacher
    folder that is gone is trained again, but for (a) of a finished seed: its score is taken from the seed's
    ``result.json`` (:func:`shared_truncated_score`)."""
    folder = Path(out) / f"seed{seed}"
    done = folder / "result.json"
    if done.is_file():
        log(f"== seed {seed}: finished, reusing {done}")
        return json.loads(done.read_text())
    seeded = recipe.with_overrides({"seed": seed})
    shared = Path(teachers_from) / f"seed{seed}" if teachers_from is not None else None
    log(f"== seed {seed}: (a) the softmax teacher cut at {truncate} tokens")
    short = shared_teacher(shared / f"teacher-{truncate}") if shared is not None else None
    measured = shared_truncated_score(shared, truncate) if short is None and shared is not None else None
    if short is None and measured is None:
        short, _ = run_teacher(seeded.with_overrides({"data": {"max_length": truncate}}),
                               folder / f"teacher-{truncate}", progress=progress, log=log)
    log(f"== seed {seed}: (b) the softmax teacher and (c) the {recipe.method} student at "
        f"{recipe.data.max_length} tokens")
    full_teacher = shared / "full" if shared is not None and shared_teacher(shared / "full") is not None else None
    report = run(seeded, folder / "full", progress=progress, log=log, teacher_from=full_teacher).to_json()
    split, metric = report["recovery"]["split"], report["task"]["primary_metric"]
    result = {"seed": seed, "split": split, "metric": metric, "truncate": truncate,
              "max_length": recipe.data.max_length, "method": recipe.method,
              "truncated": short.scores[split][metric] if short is not None else measured,
              "full": report["scores"]["teacher"][split][metric],
              "student": report["scores"]["student"][split][metric],
              "recovery": report["recovery"]["per_metric"][metric],
              "latency_at_max_length": report["latency"],
              "time_per_review": time_per_review(folder / "full", seeded, device, max_reviews)}
    atomic_write_json(done, result)
    return result


def shared_truncated_score(shared, truncate):
    """(a)'s score from another study's finished seed (its ``result.json``) when its teacher folder is gone (a
    fresh machine, the result committed): the same recipe and seed give the same teacher, so it is not trained
    again just for a number. None when there is no such result."""
    done = Path(shared) / "result.json"
    if not done.is_file():
        return None
    result = json.loads(done.read_text())
    return result["truncated"] if result.get("truncate") == truncate else None


def shared_teacher(run_dir):
    """The finished teacher stage (its StageResult) of another study's run folder, or None (then it is trained)."""
    from linearize.pipeline.artifacts import RunState

    if not (Path(run_dir) / "state.json").is_file():
        return None
    state = RunState(run_dir, None)
    return state.get("teacher") if state.done("teacher") else None


@torch.inference_mode()
def time_per_review(run_dir, recipe, device="cpu", max_reviews=None):
    """Mean whole-model forward time (ms) per test review of the run's teacher and student (see the
    module docstring), with the reviews' mean length."""
    device = torch.device(device)
    models = {"teacher": load_saved(Path(run_dir) / "teacher", converted=False),
              "student": load_saved(Path(run_dir) / "model", converted=True)}
    for model in models.values():
        model.to(device).eval()
    reviews = TaskData.load(recipe).tokenized()["test"]
    count = len(reviews) if max_reviews is None else min(max_reviews, len(reviews))
    totals, tokens = {name: 0.0 for name in models}, 0
    for index in range(-1, count):  # index -1: the warm-up, review 0 untimed
        ids = torch.tensor([reviews[max(index, 0)]["input_ids"]], device=device)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        order = list(models) if index % 2 == 0 else list(models)[::-1]
        for name in order:
            seconds = _forward_seconds(models[name], inputs, device)
            if index >= 0:
                totals[name] += seconds
        tokens += ids.shape[1] if index >= 0 else 0
    teacher_ms, student_ms = (1000 * totals[name] / count for name in ("teacher", "student"))
    return {"teacher_ms": teacher_ms, "student_ms": student_ms, "speedup": teacher_ms / student_ms,
            "reviews": count, "mean_tokens": tokens / count, "device": str(device),
            "threads": torch.get_num_threads()}


def _forward_seconds(model, inputs, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    model(**inputs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def summarize(results):
    """The table over the finished seeds: per row (a), (b), (c) the metric, its ratio to (b) (the
    recovery for (c)) and, for (b) and (c), the time per review."""
    first = results[0]
    against_full = [100 * r["truncated"] / r["full"] if r["full"] else None for r in results]
    timing = [r["time_per_review"] for r in results]
    at_length = [r["latency_at_max_length"] for r in results]
    rows = [
        {"row": f"(a) softmax teacher, cut at {first['truncate']} tokens", "metric": _mean_std(
            [r["truncated"] for r in results]), "vs_full": _mean_std(against_full)},
        {"row": f"(b) softmax teacher, {first['max_length']} tokens (extended positions)",
         "metric": _mean_std([r["full"] for r in results]), "vs_full": _mean_std([100.0] * len(results)),
         "ms_per_review": _mean_std([t["teacher_ms"] for t in timing]),
         "ms_at_max_length": _mean_std([t["teacher_ms"] for t in at_length])},
        {"row": f"(c) {first['method']} student, {first['max_length']} tokens",
         "metric": _mean_std([r["student"] for r in results]), "vs_full": _mean_std([r["recovery"] for r in results]),
         "ms_per_review": _mean_std([t["student_ms"] for t in timing]),
         "ms_at_max_length": _mean_std([t["student_ms"] for t in at_length]),
         "speedup_per_review": _mean_std([t["speedup"] for t in timing])},
    ]
    return {"metric": first["metric"], "split": first["split"], "max_length": first["max_length"],
            "seeds": [r["seed"] for r in results], "timing": {k: timing[0][k] for k in ("device", "threads")},
            "mean_tokens_per_review": timing[0]["mean_tokens"], "reviews_timed": timing[0]["reviews"],
            "rows": rows, "per_seed": results}


def render(table):
    def cell(stat, fmt):
        if stat is None:
            return "—"
        return fmt.format(stat["mean"]) + (f" ± {fmt.format(stat['std'])}" if stat["std"] else "")

    n = table["max_length"]
    lines = [f"| model | {table['metric']} ({table['split']}) | % of (b) | ms per review | ms at N = {n} | "
             "seeds |", "|:--|--:|--:|--:|--:|--:|"]
    for row in table["rows"]:
        lines.append(f"| {row['row']} | {cell(row['metric'], '{:.3f}')} | {cell(row['vs_full'], '{:.1f}')} | "
                     f"{cell(row.get('ms_per_review'), '{:.1f}')} | {cell(row.get('ms_at_max_length'), '{:.1f}')} | "
                     f"{len(table['seeds'])} |")
    speedup = table["rows"][2]["speedup_per_review"]
    lines += ["", f"(c) is {cell(speedup, '{:.2f}')}× faster than (b) per review: {table['reviews_timed']} test "
                  f"reviews, {table['mean_tokens_per_review']:.0f} tokens on average, batch 1, "
                  f"{table['timing']['device']}, {table['timing']['threads']} threads; seeds "
                  f"{', '.join(map(str, table['seeds']))}."]
    return "\n".join(lines) + "\n"


def measure(recipe, out, seeds=(0, 1, 2), *, truncate=512, device="cpu", max_reviews=None, progress=True, log=print,
            teachers_from=None):
    """Every seed (finished ones reused); the table rewritten after each. Returns the table."""
    out = Path(out)
    results, table = [], None
    for seed in seeds:
        results.append(measure_seed(recipe, seed, out, truncate=truncate, device=device, max_reviews=max_reviews,
                                    progress=progress, log=log, teachers_from=teachers_from))
        table = summarize(results)
        atomic_write_json(out / "long-reviews.json", table)
        atomic_write_text(out / "long-reviews.md", render(table))
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default=RECIPE, help=f"recipe name or YAML (default {RECIPE})")
    parser.add_argument("--out", type=Path, default=Path("runs/long-reviews"))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--truncate", type=int, default=None,
                        help=f"(a)'s length (default 512; with --quick {QUICK_TRUNCATE})")
    parser.add_argument("--quick", action="store_true", help="the recipe's quick block: a smoke test")
    parser.add_argument("--set", action="append", default=[], help="recipe override key.sub=value (repeatable)")
    parser.add_argument("--device", default="cpu", help="where the time per review is measured (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--timing-reviews", type=int, default=None, help="time only this many test reviews")
    parser.add_argument("--teachers-from", type=Path, default=None,
                        help="another study's --out: reuse its seeds' finished teachers (a) and (b) (e.g. a hybrid "
                             "variant beside the pure student: --set hybrid.window=32 --set hybrid.sinks=first)")
    args = parser.parse_args(argv)
    keep_freed_memory()  # as the linearize command does: training steps reuse their freed memory
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = load_recipe(args.recipe, overrides=parse_set(args.set), quick=args.quick)
    truncate = args.truncate or (QUICK_TRUNCATE if args.quick else 512)
    table = measure(recipe, args.out, [int(s) for s in args.seeds.split(",") if s.strip()], truncate=truncate,
                    device=args.device, max_reviews=args.timing_reviews, teachers_from=args.teachers_from)
    print(render(table))
    print(f"written to {args.out / 'long-reviews.md'}")


if __name__ == "__main__":
    try:
        main()
    except LinearizeError as error:  # a user's error: one line (LINEARIZE_DEBUG=1: the traceback)
        if os.environ.get("LINEARIZE_DEBUG"):
            raise
        raise SystemExit(f"error: {error}") from None
