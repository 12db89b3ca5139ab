#!/usr/bin/env bash
# The long-context statistics kernel on one CUDA GPU, in one go (about 5 minutes on an H200; at most 9 by its time limits):
#
#   1. the card and the versions;
#   2. bench_long_context.py --only statistics --check --sweep: the fused Triton kernel against
#      float64 on the device (bfloat16 and float32 inputs; causal, sliding-window, soft-capped,
#      bidirectional layers, grouped-query heads; then two layers of the loaded model), every
#      head of every layer against a plain forward at 32K and 128K tokens on a checkpoint of
#      Llama-3-8B's shape (random weights written by transformers on the device), and one
#      layer under a few launch settings;
#   3. `attnkit heads --stat retrieval --length 131072` on that checkpoint (the same kernel).
#
# Results go to $OUT (default ./gpu-check): long_context_statistics.{json,md}, the logs, and
# status.txt with each step's exit status. A step that fails does not stop the next.
# Run: bash benchmarks/gpu_check.sh (it needs torch with CUDA, triton and transformers; attnkit
# comes from src/). Settings from the environment: DEVICE (cuda), CHECKPOINT (a folder, written
# once), STATISTICS_ARGS (what the statistics step adds: "--check --sweep"; e.g. add
# "--lengths 32768" on a card with less memory), RETRIEVAL_LENGTH (131072).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-check}"
DEVICE="${DEVICE:-cuda}"
CHECKPOINT="${CHECKPOINT:-/tmp/attnkit-llama3-8b}"
STATISTICS_ARGS="${STATISTICS_ARGS---check --sweep}"
RETRIEVAL_LENGTH="${RETRIEVAL_LENGTH:-131072}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
: > "$OUT/status.txt"

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log, record the exit status
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local status=$?
    echo "$name: exit $status after $((SECONDS - start)) s" | tee -a "$OUT/status.txt"
    tail -n 30 "$OUT/$name.log"
}

step environment 30 bash -c 'nvidia-smi; python -c "
import torch, triton, transformers
print(\"torch\", torch.__version__, \"triton\", triton.__version__, \"transformers\", transformers.__version__)
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(0), torch.cuda.mem_get_info())"'

# shellcheck disable=SC2086  # STATISTICS_ARGS is a list of options
step statistics 380 python benchmarks/bench_long_context.py --only statistics --device "$DEVICE" \
    --checkpoint "$CHECKPOINT" --out "$OUT" $STATISTICS_ARGS

step retrieval 120 python -m attnkit heads --model "$CHECKPOINT" --stat retrieval --length "$RETRIEVAL_LENGTH" \
    --device "$DEVICE" --dtype bfloat16 --top 5 --out "$OUT/retrieval"

cat "$OUT/status.txt"
