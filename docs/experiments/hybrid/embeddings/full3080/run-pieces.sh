#!/bin/bash
# issue 34: the whole-corpus embedding student with more documents: each training review's next 510 tokens too
# (corpus.py --later-pieces 1: 3,643 training texts), seed 0, MSE-only stage 2 on the maps
cd "$(git rev-parse --show-toplevel)"
C=runs/embedding-corpus-pieces
[ -f $C/train.jsonl ] || PYTHONPATH=. .venv/bin/python docs/experiments/hybrid/embeddings/corpus.py --out $C --later-pieces 1
B='hybrid.window=128 hybrid.sinks=first stage2.trainable=attention stage2.lr=1e-2 stage2.epochs=3'
.venv/bin/linearize compare minilm-embeddings --methods hedgehog --seeds 0 --no-without-stage1 \
  --set data.train_file=$C/train.jsonl --set data.validation_file=$C/validation-with-reviews.jsonl \
  --set data.test_file=$C/test.jsonl --set data.max_length=512 --set data.max_train_examples=3643 \
  --set data.group_by_length=true --set stage1.epochs=3 --set stage1.checkpoint_every=20 \
  --variant "R128 first s2 maps pieces: $B" \
  --out runs/embeddings-pieces --threads 2
