"""An embedding corpus with whole documents in it (issue 34, item 4): the minilm-embeddings recipe trains on
movie-review sentences of at most 64 tokens, so a hybrid student whose window is 32 (exact softmax up to 64
tokens) never trains its linear part, and on documents (data.document_length: 512) it runs an untrained map.
This writes the recipe's own splits as files, with the 1,080 whole reviews of moviereviews-long's *train*
split added to the training file (the 300 test reviews the document scores use are not in it):

    train.jsonl       the first 2,000 training sentences of seed 0's split (the recipe trains on 2,000)
                      + the 1,080 training reviews
    validation.jsonl  the 320 dev sentences (selection)
    validation-with-reviews.jsonl  the same and the 120 dev reviews: a selection that sees documents (with sentences
                      alone a hybrid whose window covers them is exact there, and its stage-1 model always wins)
    test.jsonl        the 800 test sentences (the sentence scores)

    PYTHONPATH=. python docs/experiments/hybrid/embeddings/corpus.py --out runs/embedding-corpus
    C=runs/embedding-corpus
    linearize compare minilm-embeddings --methods luna --seeds 0 --no-without-stage1 \\
        --set data.train_file=$C/train.jsonl --set data.validation_file=$C/validation.jsonl \\
        --set data.test_file=$C/test.jsonl --set data.max_length=512 --set data.max_train_examples=400 \\
        --set data.group_by_length=true --variant pure --variant 'R32 first: hybrid.window=32 hybrid.sinks=first' \\
        --out runs/embeddings-docs400 --threads 2

With ``--later-pieces 1`` (``--out runs/embedding-corpus-pieces``) the training file also holds each training
review's next 510 tokens where it has 256 or more of them: more documents of the same kind for stage 1 and 2.

(``data.max_train_examples=400``: a seeded sample of the 3,080 texts, about a third of them reviews. The whole
corpus at 512 tokens runs stage 1 at ~1 text/s here: ~50 min a stage, more than one session can give both rows.)
"""
import argparse
import json
from pathlib import Path

from linearize.data.moviereviews import REVIEWS, load_moviereviews
from linearize.outputs import atomic_write_text


def later_pieces(reviews, count, piece=510, shortest=256):
    """Each review's text after its first ``piece`` tokens (what a 512-token cut keeps, less [CLS] and [SEP]),
    in up to ``count`` more pieces of ``piece`` tokens, each at least ``shortest`` tokens long (the issue's
    documents are 256-512 tokens): more document text of the same kind, none of it from the test reviews."""
    from transformers import AutoTokenizer

    from linearize.convert.loading import resolve_model_name
    from linearize.recipes import load_recipe

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_name(load_recipe("minilm-embeddings").model))
    pieces = []
    for text in reviews:
        spans = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        for start in range(piece, min(len(spans), piece * (count + 1)), piece):
            end = min(start + piece, len(spans))
            if end - start >= shortest:
                pieces.append(text[spans[start][0]:spans[end - 1][1]])
    return pieces


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=2000, help="training sentences (the recipe's 2,000)")
    parser.add_argument("--later-pieces", type=int, default=0,
                        help="also each training review's text past its first 510 tokens, in up to this many "
                             "pieces of 510 tokens (at least 256 each)")
    args = parser.parse_args()
    sentences = load_moviereviews(seed=0, dev_fraction=0.1)
    reviews = load_moviereviews(seed=0, dev_fraction=0.1, corpus=REVIEWS)
    train = list(sentences["train"]["text"][:args.sentences]) + list(reviews["train"]["text"])
    if args.later_pieces:
        train += later_pieces(reviews["train"]["text"], args.later_pieces)
    splits = {"train": train, "validation": sentences["validation"]["text"], "test": sentences["test"]["text"],
              "validation-with-reviews": list(sentences["validation"]["text"]) + list(reviews["validation"]["text"])}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, texts in splits.items():
        atomic_write_text(args.out / f"{name}.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
        print(f"{name}: {len(texts)} texts")


if __name__ == "__main__":
    main()
