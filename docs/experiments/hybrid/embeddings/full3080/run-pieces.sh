#!/bin/bash
# issue 34: the whole-corpus embedding student with more documents: each training review's next 510 tokens too
# (corpus.py --later-pieces 1: 3,643 training texts), seed 0, MSE-only stage 2 on the maps
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1  # from any folder
source docs/experiments/hybrid/embeddings/full3080/compare.sh
C=runs/embedding-corpus-pieces
[ -f $C/train.jsonl ] || PYTHONPATH=. .venv/bin/python docs/experiments/hybrid/embeddings/corpus.py --out $C --later-pieces 1
embedding_compare $C 3643 0 runs/embeddings-pieces --variant "R128 first s2 maps pieces: $B"
