"""Student-teacher agreement on the moviereviews test and dev splits, from saved run folders (run folders of `linearize run`/`compare`: teacher/ and model/).

    PYTHONPATH=. .venv/bin/python docs/experiments/levers/keep-softmax/agree.py /work/runs/recipe-seeded/seed0/luna ...
"""
import argparse

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from linearize.data import load_task_data
parser = argparse.ArgumentParser()
parser.add_argument("runs", nargs="+", help="run folders holding teacher/ and model/")
parser.add_argument("--dev-fraction", type=float, default=0.1, help="the runs' data.dev_fraction")
args = parser.parse_args()
torch.set_num_threads(1)
data, spec = load_task_data("moviereviews", dev_fraction=args.dev_fraction, seed=0)
def preds(folder, split):
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    m = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
    out = []
    texts = data[split]["text"]
    with torch.no_grad():
        for i in range(0, len(texts), 64):
            b = tok(texts[i:i+64], truncation=True, max_length=64, padding=True, return_tensors="pt")
            out.append(m(**b).logits)
    return torch.cat(out)
for run in args.runs:
    for split in ("validation", "test"):
        t, s = preds(f"{run}/teacher", split), preds(f"{run}/model", split)
        y = np.array(data[split]["label"])
        tp, sp = t.argmax(-1).numpy(), s.argmax(-1).numpy()
        dis = tp != sp
        print(f"{run} {split}: n={len(y)} teacher {np.mean(tp==y):.4f} student {np.mean(sp==y):.4f} "
              f"disagree {dis.sum()} (student right {np.sum(dis & (sp==y))}, teacher right {np.sum(dis & (tp==y))})")
