"""Hybrid attention before any training (issue 34, items 1 and 2): how far each window and sink choice
takes the untrained student's attention toward the teacher's, and which γ to start from.

The real all-MiniLM-L6-v2 (no fine-tuning) is converted to ``--method`` (Hedgehog by default: its
identity initialisation, no stage 1) with every hybrid variant: window radius R in ``--windows``
(0 = pure linear attention), sinks none or first,last (each review's [CLS] and [SEP]). On
``--reviews`` whole movie reviews of the ``moviereviews-long`` validation split cut at ``--length``
tokens, every layer's attention KL(teacher ‖ student) (nats, mean over real query rows and heads:
``linearize.distill.attention_distances``, the quantity stage 1 minimises) is measured for every γ of
``--gammas`` (one γ for every head and layer). Reported per variant: the KL per layer at the best
single γ (the value a conversion can start from), and at the best γ per layer (an oracle for a learned
γ), with the mean over layers.

Written atomically to ``--out``: ``kl-at-init.json`` (every variant × γ × layer) and ``kl-at-init.md``.

    PYTHONPATH=. python docs/experiments/hybrid/kl_at_init.py --out docs/experiments/hybrid
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import torch

from linearize.convert import convert, feature_maps_of, load_source_model, resolve_model_name
from linearize.data.moviereviews import REVIEWS, load_moviereviews
from linearize.distill.stage1 import attention_distances
from linearize.markdown import markdown_table
from linearize.outputs import atomic_write_json, atomic_write_text


def review_batch(length, count):
    """``count`` whole validation reviews tokenised to ``length`` tokens (longer ones cut, shorter padded)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_name("minilm"))
    texts = load_moviereviews(corpus=REVIEWS)["validation"]["text"][:count]
    batch = tokenizer(texts, truncation=True, max_length=length, padding="longest", return_tensors="pt")
    return dict(batch)


def measure(model, batch, gamma):
    """``{layer: kl}`` of ``model`` on ``batch`` with every hybrid γ set to ``gamma``."""
    for fm in feature_maps_of(model).values():
        if fm.is_hybrid:  # a window, or sinks alone (until 2026-11-26 only a window: sinks-only rows kept the default γ)
            fm.hybrid_log_gamma.data.fill_(math.log(gamma))
    rows = attention_distances(model, [batch], block_size=0)
    return {int(layer): stats["kl"] for layer, stats in rows.items()}


def variants(windows, sinks):
    for window in windows:
        for names in sinks:
            yield window, names


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--method", default="hedgehog")
    parser.add_argument("--windows", default="0,16,32,64")
    parser.add_argument("--sinks", default="none;first;first,last", help="sink choices, separated by ';'")
    parser.add_argument("--gammas", default="0.01,0.03,0.1,0.3,1,3,10")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--reviews", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    base = load_source_model("minilm").eval()
    batch = review_batch(args.length, args.reviews)
    gammas = [float(g) for g in args.gammas.split(",")]
    done = out_file(args)
    results = json.loads(done.read_text())["results"] if done.is_file() else []  # resumes: finished variants kept
    for window, sinks in variants([int(w) for w in args.windows.split(",")], args.sinks.split(";")):
        if any(r["window"] == window and r["sinks"] == sinks for r in results):
            continue
        model = copy.deepcopy(base)
        convert(model, args.method, window=window, sinks=sinks)
        started = time.perf_counter()
        hybrid = window or sinks != "none"
        per_gamma = {gamma: measure(model, batch, gamma) for gamma in (gammas if hybrid else [1.0])}
        results.append({"window": window, "sinks": sinks, "kl": {str(g): kl for g, kl in per_gamma.items()}})
        print(f"R={window} sinks={sinks}: {time.perf_counter() - started:.1f} s", flush=True)
        write(args, results)  # after every variant: an interrupted sweep resumes


def out_file(args):
    return Path(args.out) / "kl-at-init.json"


def summarise(result):
    """``(best single γ, its KL per layer, oracle KL per layer)`` of one variant."""
    per_gamma = {float(g): kl for g, kl in result["kl"].items()}
    layers = sorted(next(iter(per_gamma.values())))
    best = min(per_gamma, key=lambda g: sum(per_gamma[g].values()))
    oracle = [min(kl[layer] for kl in per_gamma.values()) for layer in layers]
    return best, [per_gamma[best][layer] for layer in layers], oracle


def write(args, results):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = sorted(results, key=lambda r: (r["window"], len(r["sinks"]) if r["sinks"] != "none" else 0))
    atomic_write_json(out_file(args), {"settings": vars(args), "results": results})
    rows = []
    for result in results:
        best, at_best, oracle = summarise(result)
        hybrid = result["window"] or result["sinks"] != "none"
        label = f"R = {result['window']}, sinks {result['sinks']}" if hybrid else "pure linear"
        rows.append([label, f"{best:g}" if hybrid else "-", *(f"{x:.3f}" for x in at_best),
                     f"**{sum(at_best) / len(at_best):.3f}**", f"{sum(oracle) / len(oracle):.3f}"])
    layers = len(summarise(results[0])[1])
    header = ["variant", "γ (best single)", *(f"layer {i}" for i in range(layers)), "mean", "mean, γ per layer"]
    text = (f"KL(teacher ‖ student) in nats at initialisation ({args.method}, no training), all-MiniLM-L6-v2, "
            f"{args.reviews} validation reviews cut at {args.length} tokens; command: `PYTHONPATH=. python "
            f"docs/experiments/hybrid/kl_at_init.py --out {args.out}`\n\n" + markdown_table(header, rows) + "\n")
    atomic_write_text(out / "kl-at-init.md", text)
    print(text)


if __name__ == "__main__":
    main()
