#!/usr/bin/env bash
# `make check-gpu`: the device check, for an NVIDIA machine with CUDA and Python but no Rust and
# no network. It runs the release binaries `make check-cuda` built into the carry folder
# (target/gpu-carry: bin/gpucheck and bin/synth, stripped, gzipped or not, and
# models/smollm2-4l.gguf, the
# default model's embeddings and first 4 layers), and writes one JSON file with:
#   - the device's name, compute capability, driver and memory (nvidia-smi);
#   - CUDA-against-CPU agreement (teacher-forced logprobs) on the truncated default model and
#     on a 2-layer synthetic one;
#   - decode tok/s and inter-token latency at batch 1, 16 and 64, and prefill tok/s, at context
#     512, for the default model's shape (a synthetic full-depth Q4_1 model written here) and
#     for Llama-3-8B's shape in Q4_K (also written here);
#   - whether greedy tokens are identical alone and in a batch of 16, for both shapes.
# A step that fails is recorded with its error and the others still run.
#
# Usage: scripts/check-gpu.sh [CARRY_DIR]   (default target/gpu-carry)
#   SLUICE_GPU_DEVICE   device to check (default cuda:0)
#   SLUICE_GPU_BACKEND  backend on that device (default candle)
#   SLUICE_GPU_OUT      the JSON file (default $OUT/check-gpu.json, else ./check-gpu.json)
#   SLUICE_GPU_DRY=1    tiny shapes and short runs (context 32, batches 1 and 4, 2-layer
#                       models, Llama-3-8B's shape cut to 1 layer): how this script is tested
#                       on a machine without a GPU, with SLUICE_GPU_DEVICE=cpu
#                       SLUICE_GPU_BACKEND=kernels.
# Sized for about 10 minutes on an H100-class GPU (start-up excluded); each step has a timeout.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
carry="${1:-$root/target/gpu-carry}"
device="${SLUICE_GPU_DEVICE:-cuda:0}"
backend="${SLUICE_GPU_BACKEND:-candle}"
out="${SLUICE_GPU_OUT:-${OUT:-.}/check-gpu.json}"
work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-gpu.XXXXXX")"
trap 'rm -rf "$work"' EXIT
bin="$work/bin"
truncated="$carry/models/smollm2-4l.gguf"
mkdir -p "$bin"
missing() { echo "check-gpu: $1 is missing: run 'make check-cuda' where Rust is" >&2; exit 1; }
for b in gpucheck synth; do
  if [ -e "$carry/bin/$b.gz" ]; then
    gzip -dc "$carry/bin/$b.gz" >"$bin/$b"
  elif [ -e "$carry/bin/$b" ]; then
    cp "$carry/bin/$b" "$bin/$b"
  else
    missing "$carry/bin/$b(.gz)"
  fi
  chmod +x "$bin/$b"
done
[ -e "$truncated" ] || missing "$truncated"
if [ "${SLUICE_GPU_DRY:-0}" = 1 ]; then
  ctx=32 batches=1,4 steps=3 full_layers=2 big_layers=1 tokens=24 greedy=4 limit=600
else
  ctx=512 batches=1,16,64 steps=32 full_layers= big_layers= tokens=96 greedy=24 limit=240
fi
results="$work/results"
mkdir -p "$results"

# step NAME TIMEOUT_S COMMAND...: runs a measurement, keeping its last stdout line (one JSON
# object) or its error.
step() {
  local name="$1" limit="$2"
  shift 2
  echo "check-gpu: $name: $*" >&2
  local start=$SECONDS
  if timeout "$limit" "$@" >"$results/$name.out" 2>"$results/$name.err"; then
    if [ -s "$results/$name.out" ]; then
      tail -n 1 "$results/$name.out" >"$results/$name.json"
    else
      echo "{\"ok\": true, \"seconds\": $((SECONDS - start)), \"log\": $(tail -n 1 "$results/$name.err" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))')}" >"$results/$name.json"
    fi
  else
    local rc=$?
    python3 - "$name" "$rc" "$results/$name.err" >"$results/$name.json" <<'EOF'
import json, sys
name, rc, err = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], errors="replace").read()
why = "timed out" if rc in (124, 137) else f"exit {rc}"
print(json.dumps({"error": f"{why}: {err.strip()[-2000:]}"}))
EOF
  fi
  echo "check-gpu: $name: $((SECONDS - start)) s: $(head -c 300 "$results/$name.json")" >&2
}

gpu=(--device "$device" --backend "$backend")
layers() { [ -n "$1" ] && echo "--layers $1"; }

step agree_truncated "$limit" "$bin/gpucheck" --model "$truncated" "${gpu[@]}" agree --tokens "$tokens"
step synth_small 120 "$bin/synth" --shape smollm2-135m --layers 2 --dtype q4_1 --seed 1 \
  --tokenizer-from "$truncated" --out "$work/synth-small.gguf"
step agree_synthetic "$limit" "$bin/gpucheck" --model "$work/synth-small.gguf" "${gpu[@]}" agree --tokens "$tokens"

# shellcheck disable=SC2046
step synth_smollm2 300 "$bin/synth" --shape smollm2-135m $(layers "$full_layers") --dtype q4_1 \
  --seed 2 --tokenizer-from "$truncated" --out "$work/smollm2.gguf"
step bench_smollm2 "$limit" "$bin/gpucheck" --model "$work/smollm2.gguf" "${gpu[@]}" bench \
  --batches "$batches" --ctx "$ctx" --steps "$steps"
step identical_smollm2 "$limit" "$bin/gpucheck" --model "$work/smollm2.gguf" "${gpu[@]}" identical --tokens "$greedy"
rm -f "$work/smollm2.gguf"

# shellcheck disable=SC2046
step synth_llama3_8b 400 "$bin/synth" --shape llama3-8b $(layers "$big_layers") --dtype q4_k \
  --seed 3 --tokenizer-from "$truncated" --out "$work/llama3-8b.gguf"
step bench_llama3_8b "$limit" "$bin/gpucheck" --model "$work/llama3-8b.gguf" "${gpu[@]}" bench \
  --batches "$batches" --ctx "$ctx" --steps "$steps"
step identical_llama3_8b "$limit" "$bin/gpucheck" --model "$work/llama3-8b.gguf" "${gpu[@]}" identical --tokens "$greedy"
rm -f "$work/llama3-8b.gguf"

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader \
    >"$results/nvidia-smi.csv" 2>&1 || true
fi
mkdir -p "$(dirname "$out")"
python3 - "$results" "$device" "$backend" "${SLUICE_GPU_DRY:-0}" >"$out" <<'EOF'
import json, os, sys
results, device, backend, dry = sys.argv[1:5]
doc = {"device": device, "backend": backend, "dry_run": dry == "1", "gpu": None}
smi = os.path.join(results, "nvidia-smi.csv")
if os.path.exists(smi):
    rows = [r.split(", ") for r in open(smi).read().strip().splitlines() if r]
    doc["gpu"] = [dict(zip(["name", "compute_cap", "driver", "memory"], r)) for r in rows]
for f in sorted(os.listdir(results)):
    if f.endswith(".json"):
        text = open(os.path.join(results, f)).read().strip()
        try:
            doc[f[:-5]] = json.loads(text)
        except ValueError:
            doc[f[:-5]] = {"error": f"not JSON: {text[:500]}"}
print(json.dumps(doc, indent=1))
EOF
echo "check-gpu: wrote $out"
