# The whole-corpus embedding student's `linearize compare`, sourced by the run*.sh beside it:
#   embedding_compare CORPUS TRAIN_EXAMPLES SEEDS OUT --variant "NAME: $B ..." [--variant ...]
# Hedgehog trained at 512 tokens on CORPUS's files (corpus.py: train.jsonl, validation-with-reviews.jsonl for
# selection, test.jsonl), stage 1 three epochs with a checkpoint every 20 steps, two threads. Resumable.
# B: the student every variant starts from, R = 128 + first in every layer, stage 2 on the maps alone at
# lr 1e-2 for three epochs.
B='hybrid.window=128 hybrid.sinks=first stage2.trainable=attention stage2.lr=1e-2 stage2.epochs=3'

embedding_compare() {
  local corpus=$1 examples=$2 seeds=$3 out=$4
  shift 4
  .venv/bin/linearize compare minilm-embeddings --methods hedgehog --seeds "$seeds" --no-without-stage1 \
    --set data.train_file="$corpus/train.jsonl" --set data.validation_file="$corpus/validation-with-reviews.jsonl" \
    --set data.test_file="$corpus/test.jsonl" --set data.max_length=512 --set data.max_train_examples="$examples" \
    --set data.group_by_length=true --set stage1.epochs=3 --set stage1.checkpoint_every=20 \
    "$@" --out "$out" --threads 2
}
