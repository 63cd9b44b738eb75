"""An embedding corpus with whole documents in it (issue 34, item 4): the minilm-embeddings recipe trains on
movie-review sentences of at most 64 tokens, so a hybrid student whose window is 32 (exact softmax up to 64
tokens) never trains its linear part, and on documents (data.document_length: 512) it runs an untrained map.
This writes the recipe's own splits as files, with the 1,080 whole reviews of moviereviews-long's *train*
split added to the training file (the 300 test reviews the document scores use are not in it):

    train.jsonl       the first 2,000 training sentences of seed 0's split (the recipe trains on 2,000)
                      + the 1,080 training reviews
    validation.jsonl  the 320 dev sentences (selection)
    test.jsonl        the 800 test sentences (the sentence scores)

    PYTHONPATH=. python docs/experiments/hybrid/embeddings/corpus.py --out runs/embedding-corpus
    linearize run minilm-embeddings --task embeddings --train-file runs/embedding-corpus/train.jsonl \\
        --validation-file runs/embedding-corpus/validation.jsonl --test-file runs/embedding-corpus/test.jsonl \\
        --set data.max_length=512 --set data.max_train_examples=null --set data.group_by_length=true \\
        [--set hybrid.window=32 --set hybrid.sinks=first] --out runs/emb-docs-...
"""
import argparse
import json
from pathlib import Path

from linearize.data.moviereviews import REVIEWS, load_moviereviews
from linearize.outputs import atomic_write_text


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=2000, help="training sentences (the recipe's 2,000)")
    args = parser.parse_args()
    sentences = load_moviereviews(seed=0, dev_fraction=0.1)
    reviews = load_moviereviews(seed=0, dev_fraction=0.1, corpus=REVIEWS)
    train = list(sentences["train"]["text"][:args.sentences]) + list(reviews["train"]["text"])
    splits = {"train": train, "validation": sentences["validation"]["text"], "test": sentences["test"]["text"]}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, texts in splits.items():
        atomic_write_text(args.out / f"{name}.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
        print(f"{name}: {len(texts)} texts")


if __name__ == "__main__":
    main()
