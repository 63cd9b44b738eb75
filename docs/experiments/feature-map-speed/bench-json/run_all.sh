#!/bin/bash
# before (the branch's base commit 6ee126d, with this branch's bench harness) and after, one after the other
cd /work/wt/speed
M='luna,luna(shared_projections=false,projections=16),hedgehog,t2r,darkformer'
for tag in before after; do
  P=$([ $tag = before ] && echo /tmp/speed/before || echo /work/wt/speed)
  echo "$tag A start $(uptime)"
  PYTHONPATH=$P .venv/bin/python -m linearize.cli bench attention --methods "$M" --seq-lens 128,512 --model minilm \
    --model-seq-lens 128,512 --batch-size 8 --threads 1 --clock cpu --repeats 7 --no-memory --out runs/feature-map-speed/C-$tag > runs/feature-map-speed/C-$tag.log 2>&1
done
for tag in before after; do
  P=$([ $tag = before ] && echo /tmp/speed/before || echo /work/wt/speed)
  echo "$tag B start $(uptime)"
  PYTHONPATH=$P .venv/bin/python -m linearize.cli bench attention --methods "$M" --seq-lens 4096 --model none \
    --batch-size 1 --threads 1 --clock cpu --repeats 7 --no-memory --out runs/feature-map-speed/D-$tag > runs/feature-map-speed/D-$tag.log 2>&1
done
echo "end $(uptime)"
