#!/bin/bash
# issue 34: seeds 1 and 2 of the whole-corpus embedding student (MSE-only stage 2 on the maps), beside seed 0
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1  # from any folder
source docs/experiments/hybrid/embeddings/full3080/compare.sh
embedding_compare runs/embedding-corpus 3080 0,1,2 runs/embeddings-full --variant "R128 first s2 maps: $B"
