#!/bin/bash
# issue 34: a Hedgehog map twice as wide (options.hedgehog.feature_dim=64: W is 64 × 32 per head, 128 features
# against the head dim's 64), seed 0, the whole 3,080-text corpus, MSE-only stage 2 on the maps. neighbours.py
# --split train found the student's top-10 error as large on its training reviews as on held-out ones: an error of
# fit, so what the maps can hold is a lever. A new stage 1 (~40 min) and stage 2 (~35 min) on 2 cores; resumable.
# C and OUT: the corpus and the compare folder (defaults below).
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1  # from any folder
source docs/experiments/hybrid/embeddings/full3080/compare.sh
embedding_compare "${C:-runs/embedding-corpus}" 3080 0 "${OUT:-runs/embeddings-full}" \
  --variant "R128 first s2 maps fd64: $B options.hedgehog.feature_dim=64"
