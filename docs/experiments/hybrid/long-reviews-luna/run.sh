#!/bin/bash
# Issue 34's last comparison: "on the long reviews, the two best methods, hybrid next to pure". Hedgehog's rows
# are in hybrid RESULTS §8 (pure: docs/experiments/long-reviews); this is LUNA's, the default recipe's LUNA
# (one projection per head, M = 16) on minilm-longreviews at 2,048 tokens, seeds 0-2:
#   - pure: the recipe's window off; it trains its own teachers (a) cut at 512 and (b) at 2,048 per seed;
#   - hybrid: the recipe's window (R = 32 + first, layers 1-2), the same teachers (--teachers-from).
# A seed's pair lands before the next seed starts. Resumable: a re-run continues inside its run folders and
# reuses finished seeds. Budget on 2 CPU cores: per seed ~50 min of teachers, ~30-70 min per student.
#   OUT=/work/runs bash docs/experiments/hybrid/long-reviews-luna/run.sh   # default OUT: runs
set -e
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1  # from any folder
OUT=${OUT:-runs}
LUNA='--set method=luna --set options.luna.shared_projections=false --set options.luna.projections=16'
for last in 0 1 2; do
  seeds=$(seq -s, 0 $last)
  PYTHONPATH=. .venv/bin/python docs/experiments/long-reviews/measure.py --out "$OUT/lr-luna-pure" --seeds "$seeds" \
    $LUNA --set hybrid.window=0 --set hybrid.sinks=none --set hybrid.hybrid_layers=null --threads 2
  PYTHONPATH=. .venv/bin/python docs/experiments/long-reviews/measure.py --out "$OUT/lr-luna-hybrid" --seeds "$seeds" \
    $LUNA --teachers-from "$OUT/lr-luna-pure" --threads 2
done
