#!/bin/bash
# Issue 35: can the default recipe's LUNA take M = 8 projections per head (64 features) instead of M = 16?
# At batch 8 x 128 tokens per-head M = 8 runs at 1.05x softmax's time against M = 16's 1.19x (user-state
# RESULTS, eighteenth session: the knot lookup's values, M per token and head, are the cost). The recipe's
# accuracy must hold (issue 34: every seed >= 99% of the teacher, mean >= 99.5%): minilm-moviereviews, the
# recipe as it is (KD 0.5, one stage-2 epoch), both variants on the same teachers, seeds 0-2 (~20 min a seed on
# two idle cores). Resumable: `linearize compare` continues inside its run folders.
#   OUT=/work/runs bash docs/experiments/levers/luna-m8/run.sh   # default OUT: runs
set -e
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1  # from any folder
OUT=${OUT:-runs}
HERE=docs/experiments/levers/luna-m8
.venv/bin/linearize compare --methods luna --seeds 0,1,2 --no-without-stage1 --out "$OUT/luna-m8" --threads 2 \
  --variant "M16 (the recipe)" --variant "M8: options.luna.projections=8"
cp "$OUT/luna-m8"/compare.{md,json} "$HERE/"
