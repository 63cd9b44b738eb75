"""How far a window alone takes the embedding student on documents (issue 34, items 2 and 4): the real
all-MiniLM-L6-v2 (the ``minilm-embeddings`` recipe's teacher, the checkpoint as it is) converted to hybrid
attention with windows of R tokens and the first token exact (``--sinks``: also or instead the last), no training at all (stage 1 and stage 2 skipped, γ
at its measured start), scored as the recipe scores its students: agreement with the teacher's normalised
embeddings on the 300 held-out whole reviews cut at 512 tokens (``doc_cosine``, ``doc_top10_overlap``) and on the
800 test sentences (``cosine``, ``top10_overlap``).

The exact part of a hybrid layer is each query's block of R tokens and the two blocks beside it, so a document of
at most 2R tokens is read exactly (the student is the teacher there); R = 0 with no sinks is pure linear attention.
Each variant's scores go to ``--out/<variant>.json`` when done (a re-run skips it); the table (``windows.md``,
``windows.json``) is written atomically after every variant.

    PYTHONPATH=. python docs/experiments/hybrid/embedding_windows.py --out runs/embedding-windows
    PYTHONPATH=. python docs/experiments/hybrid/embedding_windows.py --out runs/embedding-windows \
        --methods hedgehog --windows 64,128 --sinks first,last
    PYTHONPATH=. python docs/experiments/hybrid/embedding_windows.py --out runs/embedding-windows \
        --methods hedgehog --windows 128,192 --hybrid-layers 'all;0,1;0,1,2;1,2;0,1,2,3'
"""

from __future__ import annotations

import argparse
import copy
import json
from itertools import product
from pathlib import Path

import torch

from linearize.attention.feature_maps import options_for
from linearize.convert.api import convert
from linearize.markdown import markdown_table
from linearize.metrics import agreement
from linearize.outputs import atomic_write_json, atomic_write_text
from linearize.pipeline.inputs import TaskData
from linearize.pipeline.single_stage import load_model_for_task
from linearize.recipes import load_recipe

WINDOWS = (0, 32, 64, 128, 256)
METRICS = ("cosine", "top10_overlap", "doc_cosine", "doc_top10_overlap")


def sentence_agreement(task, model):
    """``{"cosine", "top10_overlap"}`` of ``model``'s test-sentence embeddings against the teacher's (the targets)."""
    from linearize.data import text_dataloader
    from linearize.evaluation import predict

    test = task.tokenized()["test"]
    loader = text_dataloader(test, task.processor, task.eval_config.batch_size)
    return agreement(predict(model, loader, task=task.spec)[0], torch.tensor(test["label"]))


def variant_scores(task, teacher, method, options, window, args, layers=None):
    sinks = args.sinks if window else "none"
    label = f"{method} R={window}" + (f" + {sinks.replace(',', ' + ')}" if window else "")
    if layers is not None:  # main() pairs layer subsets with windows only
        label += " in layers " + "-".join(map(str, layers))
    done = args.out / f"{label.replace(' ', '').replace('=', '').replace('+', '-')}.json"
    if done.is_file():
        return label, json.loads(done.read_text())
    student = teacher if method == "teacher" else convert(copy.deepcopy(teacher), method, window=window,
                                                        sinks=sinks, hybrid_layers=layers,
                                                        **options).eval()
    with torch.inference_mode():
        scores = {**sentence_agreement(task, student), **task.document_agreement(student)}
    atomic_write_json(done, scores)
    return label, scores


def layer_subsets(text):
    """``"all;0,1"`` → ``[None, [0, 1]]``: None is every converted layer."""
    return [None if part.strip() == "all" else [int(i) for i in part.split(",")] for part in text.split(";")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--methods", default="luna,hedgehog")
    parser.add_argument("--windows", default=",".join(map(str, WINDOWS)))
    parser.add_argument("--sinks", default="first", help="the exact sink tokens beside a window: first, last or first,last")
    parser.add_argument("--hybrid-layers", default="all", help="';'-separated layer subsets that take the window, "
                        "e.g. 'all;0,1;0,1,2' (the others pure linear attention)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    config = load_recipe("minilm-embeddings")
    task = TaskData.load(config)
    teacher = load_model_for_task(config.model, task.spec)[0].eval()
    task.set_targets(teacher)
    rows = []
    for method in args.methods.split(","):
        options = options_for(method, config.options)  # the recipe's LUNA (M = 16, per head); others their defaults
        for window, layers in product((int(w) for w in args.windows.split(",")), layer_subsets(args.hybrid_layers)):
            if layers is not None and not window:
                continue  # pure linear attention has no hybrid layers to choose
            label, scores = variant_scores(task, teacher, method, options, window, args, layers)
            rows.append([label] + [f"{scores[m]:.3f}" for m in METRICS])
            atomic_write_json(args.out / "windows.json", {"rows": rows, "metrics": METRICS})
            atomic_write_text(args.out / "windows.md", markdown_table(["student (untrained)", *METRICS], rows) + "\n")
            print(rows[-1], flush=True)


if __name__ == "__main__":
    main()
