#!/usr/bin/env bash
# The GPU battery of docs/experiments/bench/RESULTS.md#gpu in one call of a lent GPU machine: the
# CUDA tests, bf16 stage-1/stage-2 steps on real geometries, `linearize bench attention` (bf16,
# fp32) and `linearize bench long` (bf16) against SDPA. Every step has its own time limit; the
# results are packed into $OUT/results.tgz after each step (a stopped run still returns the rest).
# Uses the machine's own Python (torch there) with the wheels in .whl (typer, transformers as here),
# made here, ignored by git, and named in the device run's carry:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp #     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl typer==0.29.2 transformers==5.24.0 #     pydantic pydantic-core annotated-types typing-inspection typing_extensions
# then: device run `bash docs/experiments/bench/gpu_battery.sh`, carry [".whl"], timeout ~420 s.
# Arguments: the steps to run (default all): pytest steps bench-bf16 bench-long bench-fp32 kernels
# bench-long-hybrid user-state user-state-compiled flex (hybrid RESULTS §13: flex_attention's exact part).
# The MiniLM checkpoint (80 MB) does not travel: bench long measures its geometry with random weights.
set -u
WANT=" ${*:-pytest steps bench-bf16 bench-long bench-fp32 kernels bench-long-hybrid user-state user-state-compiled flex} "
RES=/tmp/results; mkdir -p "$RES"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
pack() { tar czf "$OUT/results.tgz" -C "$RES" . ; }
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  [[ "$WANT" == *" $name "* ]] || return 0
  echo "=== $name ($(date +%T))"
  local start=$SECONDS
  timeout "$limit" "$@" > "$RES/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc in $((SECONDS - start)) s"; tail -n 15 "$RES/$name.log"; pack
}
L="python3 -m linearize.cli"
{ nvidia-smi; python3 -c "import torch, transformers, typer; print(torch.__version__, torch.version.cuda, transformers.__version__, typer.__version__, torch.cuda.get_device_name())"; } > "$RES/machine.txt" 2>&1
cat "$RES/machine.txt" | tail -n 3
step pytest 90 python3 -m pytest -p no:cacheprovider -n 8 -rs tests/test_devices.py tests/test_bench.py
python3 -c "import transformers as T; T.BertModel(T.BertConfig(hidden_size=384, num_hidden_layers=6, intermediate_size=1536)).save_pretrained('/tmp/minilm-geometry')"
user_state() {  # saved folders (MiniLM geometry, random weights) timed in 3 fresh plain-transformers processes
  for spec in "hedgehog:" "hedgehog-w32:--window 32 --sinks first"; do
    local name=${spec%%:*} extra=${spec#*:}
    $L convert /tmp/minilm-geometry --method hedgehog $extra --max-length 16384 --out /tmp/$name || return 1
    $L bench folder /tmp/$name --device cuda --dtype bf16 --processes 3 --seq-lens 512,4096,16384 || return 1
    cp /tmp/$name/bench.json "$RES/user-state-$name.json"
  done
  $L bench folder /tmp/hedgehog --device cuda --dtype bf16 --processes 3 --batch-size 8 --seq-lens 128,512 &&
    cp /tmp/hedgehog/bench.json "$RES/user-state-hedgehog-batch8.json"
}
export L RES
step user-state 150 bash -c "$(declare -f user_state); user_state"
compiled() {  # the folders user-state made, each fresh process compiling both models (CUDA graphs) first
  for name in hedgehog hedgehog-w32; do
    $L bench folder /tmp/$name --device cuda --dtype bf16 --processes 2 --compile-mode reduce-overhead --warmup 3 \
      --seq-lens 512,4096,16384 || return 1
    cp /tmp/$name/bench.json "$RES/user-state-$name-compiled.json"
  done
}
step user-state-compiled 300 bash -c "$(declare -f compiled); compiled"
step kernels 60 python3 docs/experiments/bench/gpu_kernels.py --out "$RES/kernels"
step bench-long 150 $L bench long --device cuda --dtype bf16 --geometries /tmp/minilm-geometry,modernbert-base --out "$RES/bench-long-cuda"
step bench-long-hybrid 150 $L bench long --device cuda --dtype bf16 --geometries /tmp/minilm-geometry --out "$RES/bench-long-hybrid" \
  --methods 'hedgehog,hedgehog(window=32,sinks=first),hedgehog(window=32,sinks=first,hybrid_layers=1+2)'
step bench-fp32 60 $L bench attention --device cuda --dtype fp32 --seq-lens 512,2048,4096,8192,16384,32768 --model none --out "$RES/bench-cuda-fp32"
step bench-bf16 90 $L bench attention --device cuda --dtype bf16 --seq-lens 512,2048,4096,8192,16384,32768 --model none --out "$RES/bench-cuda-bf16"
step steps 120 python3 docs/experiments/bench/gpu_steps.py --device cuda --out "$RES/steps"
step flex 120 python3 docs/experiments/hybrid/flex_probe.py --device cuda --seq-lens 2048,8192,32768
echo done
