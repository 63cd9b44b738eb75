#!/bin/bash
# issue 34: seeds 1 and 2 of the whole-corpus embedding student (MSE-only stage 2 on the maps), beside seed 0
cd "$(git rev-parse --show-toplevel)"
C=runs/embedding-corpus
B='hybrid.window=128 hybrid.sinks=first stage2.trainable=attention stage2.lr=1e-2 stage2.epochs=3'
.venv/bin/linearize compare minilm-embeddings --methods hedgehog --seeds 0,1,2 --no-without-stage1 \
  --set data.train_file=$C/train.jsonl --set data.validation_file=$C/validation-with-reviews.jsonl \
  --set data.test_file=$C/test.jsonl --set data.max_length=512 --set data.max_train_examples=3080 \
  --set data.group_by_length=true --set stage1.epochs=3 --set stage1.checkpoint_every=20 \
  --variant "R128 first s2 maps: $B" \
  --out runs/embeddings-full --threads 2
