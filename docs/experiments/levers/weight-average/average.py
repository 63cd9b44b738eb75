"""The stage-1 student and a stage-2 student of the same run averaged in weight space,
θ(α) = (1 − α)·θ_stage1 + α·θ_stage2 (the interpolation of Wortsman et al., "Robust fine-tuning of
zero-shot models", CVPR 2022, eq. 1, WiSE-FT), scored on the moviereviews dev and test splits with
the teacher's accuracy and the disagreements beside it. Every model is loaded with plain transformers.

    PYTHONPATH=. .venv/bin/python docs/experiments/levers/weight-average/average.py \
        --teacher RUN/teacher --stage1 RUN/stage1 --stage2 S2 [--alphas 0,0.25,0.5,0.75,1]
"""
import argparse
import json

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from linearize.data import load_task_data


def load(folder):
    return AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()


def predictions(model, tokenizer, texts):
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), 64):
            batch = tokenizer(texts[i:i + 64], truncation=True, max_length=64, padding=True, return_tensors="pt")
            out.append(model(**batch).logits.argmax(-1))
    return torch.cat(out).numpy()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--teacher", required=True)
    parser.add_argument("--stage1", required=True)
    parser.add_argument("--stage2", required=True)
    parser.add_argument("--alphas", default="0,0.25,0.5,0.75,1")
    parser.add_argument("--dev-fraction", type=float, default=0.1)
    args = parser.parse_args()
    torch.set_num_threads(2)
    data, _ = load_task_data("moviereviews", dev_fraction=args.dev_fraction, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    teacher, first, second = load(args.teacher), load(args.stage1), load(args.stage2)
    start, end = first.state_dict(), second.state_dict()
    assert start.keys() == end.keys(), "the two students differ in their weights' names"
    splits = {split: (data[split]["text"], np.array(data[split]["label"])) for split in ("validation", "test")}
    taught = {split: predictions(teacher, tokenizer, texts) for split, (texts, _) in splits.items()}
    rows = []
    for alpha in (float(a) for a in args.alphas.split(",")):
        first.load_state_dict({k: (1 - alpha) * start[k] + alpha * end[k] if start[k].is_floating_point() else end[k]
                               for k in start})
        row = {"alpha": alpha}
        for split, (texts, labels) in splits.items():
            pred = predictions(first, tokenizer, texts)
            row[split] = {"student": float(np.mean(pred == labels)), "teacher": float(np.mean(taught[split] == labels)),
                          "disagree": int(np.sum(pred != taught[split]))}
        rows.append(row)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
