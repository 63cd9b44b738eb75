"""Which layers need the window: recovery with no training when only some layers are hybrid (issue 34).

The fine-tuned softmax teacher is converted to Hedgehog with R = 32 + first in every layer (γ at its measured
start, no stage 1 or 2); then the layers outside a subset are made pure linear attention again
(``FeatureMap.make_hybrid(0)``), in this process (not a saved folder: the conversion record holds one window for
every layer). Each variant is scored on the task's dev and test reviews at 2,048 tokens beside the teacher:
accuracy, agreement with the teacher's predicted labels, and the mean KL from the teacher's class
probabilities to the student's. Agreement and KL compare each review with itself, so they separate variants
that accuracy on 420 reviews cannot (one standard error of a 300-review accuracy is ~2.5 points).

    PYTHONPATH=. python docs/experiments/hybrid/layer_subsets.py runs/lr-r32-first/seed0/full/teacher --out runs/layer-subsets
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from linearize import convert
from linearize.convert import feature_maps_of
from linearize.markdown import markdown_table
from linearize.outputs import atomic_write_json, atomic_write_text
from linearize.pipeline import TaskData
from linearize.recipes import load_recipe

SUBSETS = {"pure": (), "all": (0, 1, 2, 3, 4, 5), "1,2,3": (1, 2, 3), "1,2": (1, 2), "2,3,4": (2, 3, 4),
           "1,2,3,4": (1, 2, 3, 4), "0,1,2": (0, 1, 2), "3,4,5": (3, 4, 5), "0,1": (0, 1), "0": (0,), "1": (1,)}


@torch.inference_mode()
def class_probabilities(model, loaders):
    """``{split: (probabilities [n, classes], labels [n])}`` of ``model`` on each loader."""
    out = {}
    for split, loader in loaders.items():
        probs, labels = [], []
        for batch in loader:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            probs.append(logits.float().softmax(-1))
            labels.append(batch["labels"])
        out[split] = (torch.cat(probs), torch.cat(labels))
    return out


def scores(student, teacher):
    """Per split: accuracy, agreement with the teacher's labels, mean KL(teacher ‖ student) of the class
    probabilities."""
    out = {}
    for split, (probs, labels) in student.items():
        reference = teacher[split][0]
        kl = (reference * (reference.clamp_min(1e-12).log() - probs.clamp_min(1e-12).log())).sum(-1).mean()
        out[split] = {"accuracy": (probs.argmax(-1) == labels).float().mean().item(),
                      "agreement": (probs.argmax(-1) == reference.argmax(-1)).float().mean().item(),
                      "kl": kl.item()}
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("teacher", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    recipe = load_recipe("minilm-longreviews").with_overrides({"seed": 0, "eval": {"batch_size": 8}})
    task = TaskData.load(recipe)
    loaders = {split: task.loaders(8, 0)[split] for split in ("validation", "test")}
    from transformers import AutoModelForSequenceClassification

    teacher = AutoModelForSequenceClassification.from_pretrained(args.teacher).eval()
    reference = class_probabilities(teacher, loaders)
    results = json.loads((args.out / "layer-subsets.json").read_text()) if (args.out / "layer-subsets.json").is_file() \
        else {}
    for name, layers in SUBSETS.items():
        if name in results:
            continue
        model = AutoModelForSequenceClassification.from_pretrained(args.teacher).eval()
        convert(model, "hedgehog", window=32 if layers else 0, sinks="first" if layers else None, max_length=2048)
        for index, fm in feature_maps_of(model).items():
            if index not in layers:
                fm.make_hybrid(0)
        results[name] = scores(class_probabilities(model, loaders), reference)
        atomic_write_json(args.out / "layer-subsets.json", results)
        print(name, json.dumps(results[name]), flush=True)
    rows = [[name, *(f"{results[name][split][key]:{fmt}}" for split in ("validation", "test")
                     for key, fmt in (("accuracy", ".3f"), ("agreement", ".3f"), ("kl", ".4f")))]
            for name in SUBSETS]
    header = ["hybrid layers (R = 32 + first)", *(f"{split} {key}" for split in ("dev", "test")
                                                   for key in ("accuracy", "agreement", "KL"))]
    atomic_write_text(args.out / "layer-subsets.md", f"teacher {args.teacher}, no training\n\n"
                      f"{markdown_table(header, rows)}\n")


if __name__ == "__main__":
    main()
