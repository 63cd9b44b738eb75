#!/bin/bash
# Issue 34's last comparison: "on the long reviews, the two best methods, hybrid next to pure". Hedgehog's rows
# are in hybrid RESULTS §8 (pure: docs/experiments/long-reviews); this is LUNA's, the default recipe's LUNA
# (one projection per head, M = 16) on minilm-longreviews at 2,048 tokens, seeds 0-2:
#   - pure: the recipe's window off; it trains its own teachers (a) cut at 512 and (b) at 2,048 per seed;
#   - hybrid: the recipe's window (R = 32 + first, layers 1-2), the same teachers (--teachers-from).
# A seed's pair lands before the next seed starts. Budget on 2 CPU cores: per seed ~50 min of teachers,
# ~30-70 min per student.
# Resumable: a re-run continues inside its run folders and reuses finished seeds. A finished seed's result is
# also copied here (pure/seedN/result.json, hybrid/seedN/result.json) to be committed, and a run on a fresh
# machine starts from those: only unfinished seeds train. (A hybrid seed whose pure teachers are gone trains
# teacher (b) again, the same seed and recipe, and takes (a)'s score from the pure seed's result.json.)
#   OUT=/work/runs bash docs/experiments/hybrid/long-reviews-luna/run.sh   # default OUT: runs
set -e
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1  # from any folder
OUT=${OUT:-runs}
HERE=docs/experiments/hybrid/long-reviews-luna
LUNA='--set method=luna --set options.luna.shared_projections=false --set options.luna.projections=16'
restore() {  # the committed finished seeds of variant $1 into its run folder
  for done in "$HERE/$1"/seed*/result.json; do
    [ -f "$done" ] || continue
    seed=$(basename "$(dirname "$done")")
    mkdir -p "$OUT/lr-luna-$1/$seed" && cp -n "$done" "$OUT/lr-luna-$1/$seed/result.json"
  done
}
keep() {  # variant $1's finished seeds and table, copied here
  for done in "$OUT/lr-luna-$1"/seed*/result.json; do
    seed=$(basename "$(dirname "$done")")
    mkdir -p "$HERE/$1/$seed" && cp "$done" "$HERE/$1/$seed/result.json"
  done
  cp "$OUT/lr-luna-$1"/long-reviews.{json,md} "$HERE/$1/"
}
restore pure; restore hybrid
for last in 0 1 2; do
  seeds=$(seq -s, 0 $last)
  PYTHONPATH=. .venv/bin/python docs/experiments/long-reviews/measure.py --out "$OUT/lr-luna-pure" --seeds "$seeds" \
    $LUNA --set hybrid.window=0 --set hybrid.sinks=none --set hybrid.hybrid_layers=null --threads 2
  keep pure
  PYTHONPATH=. .venv/bin/python docs/experiments/long-reviews/measure.py --out "$OUT/lr-luna-hybrid" --seeds "$seeds" \
    $LUNA --teachers-from "$OUT/lr-luna-pure" --threads 2
  keep hybrid
done
