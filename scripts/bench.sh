#!/usr/bin/env bash
# make bench: measure the peer (llama.cpp through llama-cpp-python) when its venv exists, then
# sluice's forward pass, printing sluice's figures and the ratios to the peer from this run.
# Then the candle backend on the CPU beside it.
set -euo pipefail
py="$1"; peers="$2"
root="$(cd "$(dirname "$0")/.." && pwd)"
model="${SLUICE_MODEL_DIR:-$root/models/cache}/SmolLM2-135M-Instruct.Q4_1.gguf"
cargo build --release -p sluice-models --example bench
peer_args=()
if [ -x "$py" ] && [ -f "$peers/llamacpp_bench.py" ]; then
  out="$(mktemp)"
  echo "measuring the peer: $peers/llamacpp_bench.py (2 threads)"
  "$py" "$peers/llamacpp_bench.py" "$model" 2 | tee "$out"
  peer_args=(--peer "$out")
else
  echo "peer venv $py not found: sluice figures only (see $peers/llamacpp_bench.py to install it)"
fi
"$root/target/release/examples/bench" --model "$model" "${peer_args[@]}"
# The candle backend on the same CPU, for comparison (it exists for correctness on the CPU and
# for speed on a GPU): one repetition, a shorter run, batches 1 and 16.
echo
"$root/target/release/examples/bench" --model "$model" --backend candle --repeat 1 --steps 16 \
  --batches 16
