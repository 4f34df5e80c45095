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
  rc=0
  "$py" "$peers/llamacpp_bench.py" "$model" 2 >"$out" || rc=$?
  if [ "$rc" -eq 0 ]; then
    cat "$out"
    peer_args=(--peer "$out")
  else
    # A peer that cannot run leaves sluice's figures without ratios; it does not stop the bench.
    echo "the peer failed (exit $rc): sluice figures only"
    if [ "$rc" -eq 132 ]; then
      # SIGILL: a native llama.cpp build uses instructions the CPU advertises but this host
      # does not allow (AMX in some VMs).
      echo "illegal instruction: rebuild the peer without native tuning, e.g." \
        "CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON'" \
        "pip install --no-cache-dir --force-reinstall llama-cpp-python==0.3.36"
    fi
  fi
else
  echo "peer venv $py not found: sluice figures only (see $peers/llamacpp_bench.py to install it)"
fi
"$root/target/release/examples/bench" --model "$model" "${peer_args[@]}"
# The candle backend on the same CPU, for comparison (it exists for correctness on the CPU and
# for speed on a GPU): one repetition, a shorter run, batches 1 and 16.
echo
"$root/target/release/examples/bench" --model "$model" --backend candle --repeat 1 --steps 16 \
  --batches 16
