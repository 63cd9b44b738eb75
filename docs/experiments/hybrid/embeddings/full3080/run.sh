#!/bin/bash
# issue 34: the embedding student on the whole 3,080-text corpus, seed 0, with and without stage 2's similarity term (β 0.01, 0.1)
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1  # from any folder
source docs/experiments/hybrid/embeddings/full3080/compare.sh
embedding_compare runs/embedding-corpus 3080 0 runs/embeddings-full \
  --variant "R128 first s2 maps sim0.01: $B stage2.similarity_weight=0.01" --variant "R128 first s2 maps: $B" \
  --variant "R128 first s2 maps sim0.1: $B stage2.similarity_weight=0.1"
