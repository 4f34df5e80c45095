#!/usr/bin/env bash
# `make check-gpu`: the device check, for an NVIDIA machine with CUDA and Python but no Rust and
# no network. It runs the release binaries `make check-cuda` built into the carry folder
# (target/gpu-carry: bin/gpucheck, bin/synth and bin/sluice, stripped, compressed with xz or
# gzip or not, and
# models/smollm2-4l.gguf, the
# default model's embeddings and first 4 layers), and writes one JSON file with:
#   - the device's name, compute capability, driver and memory (nvidia-smi);
#   - CUDA-against-CPU agreement (teacher-forced logprobs) on the truncated default model and
#     on a 2-layer synthetic one;
#   - decode tok/s and inter-token latency at batch 1, 16 and 64, and prefill tok/s, at context
#     512, for the default model's shape (a synthetic full-depth Q4_1 model written here) and
#     for Llama-3-8B's shape in Q4_K (also written here);
#   - decode at batch 1 with each row's context walked by one block per KV head
#     (SLUICE_PAGED_SPLITS=0) instead of split over several (the default at small batches),
#     for both shapes (bench_*_unsplit, against bench_*'s batch 1);
#   - for the candle backend, each phase's share of a decode step at batch 1 and the largest
#     batch (gpucheck profile: launches, matmuls, attention);
#   - the paged-attention op against the gather path (gpucheck attention, candle backend):
#     teacher-forced logprobs of both on the device, and decode tok/s at each batch size on
#     each path, for both shapes;
#   - decode steps replayed from CUDA graphs against eager ones (gpucheck graphs, candle
#     backend): teacher-forced logprobs both ways, steps replayed and graphs captured (or why
#     capturing failed), decode tok/s at each batch size each way, for the truncated default
#     model and both shapes;
#   - a step's logits copied to the host through pageable memory, into page-locked buffers,
#     and with greedy and sampled rows reduced to their token on the device (gpucheck
#     host-copy, candle backend): logprobs each way, the tokens picked on the device against
#     the host's, greedy and temperature-1 decode tok/s at each batch size each way, for both
#     shapes;
#   - whether greedy tokens are identical alone and in a batch of 16, for both shapes and the
#     truncated default model (real weights: random ones leave near-ties that any rounding
#     difference flips);
#   - `sluice serve` on the device, over HTTP, for the truncated default model (also with
#     SLUICE_CUDA_GRAPHS=1) and Llama-3-8B's shape: KV pool sized from free memory,
#     `vllm:cache_config_info`, chat completions (scripts/gpu-serve-check.py).
# A step that fails is recorded with its error and the others still run.
#
# Usage: scripts/check-gpu.sh [CARRY_DIR]   (default target/gpu-carry)
#   SLUICE_GPU_DEVICE   device to check (default cuda:0)
#   SLUICE_GPU_BACKEND  backend on that device (default candle)
#   SLUICE_GPU_OUT      the JSON file (default $OUT/check-gpu.json, else ./check-gpu.json)
#   SLUICE_ATTENTION    the candle backend's attention path for every step but the
#                       attention ones (auto, gather or paged; default auto: decodes paged)
#   SLUICE_GPU_BUDGET_S seconds for the whole run (default none): steps get what is left, and
#                       the last ones are skipped, not killed halfway, when it runs out
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
for b in gpucheck synth sluice; do
  if [ -e "$carry/bin/$b.xz" ]; then
    # Python's lzma: the GPU machine may lack the xz tool.
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$carry/bin/$b.xz" "$bin/$b"
  elif [ -e "$carry/bin/$b.gz" ]; then
    gzip -dc "$carry/bin/$b.gz" >"$bin/$b"
  elif [ -e "$carry/bin/$b" ]; then
    cp "$carry/bin/$b" "$bin/$b"
  elif [ "$b" = sluice ]; then
    continue # optional: the serve steps are skipped without it
  else
    missing "$carry/bin/$b(.gz)"
  fi
  chmod +x "$bin/$b"
done
[ -e "$truncated" ] || missing "$truncated"
# The binaries load the CUDA 13 runtime, cuBLAS, cuRAND and NVRTC by soname. A machine with no
# system toolkit has them in Python's NVIDIA wheels (PyTorch's own), so their lib folders go on
# the loader's path after any the caller set; libcuda.so.1 comes from the driver.
if command -v python3 >/dev/null 2>&1; then
  wheel_libs="$(python3 - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except ImportError:
    roots = []
dirs = sorted({os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "**", "lib*.so.*"), recursive=True)})
print(":".join(dirs))
EOF
)"
  for d in /usr/local/cuda/lib64 ${wheel_libs//:/ }; do
    [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
  done
  export LD_LIBRARY_PATH
fi
if command -v ldd >/dev/null 2>&1; then
  echo "check-gpu: the CUDA libraries gpucheck loads:" >&2
  ldd "$bin/gpucheck" | grep -E 'cuda|cublas|curand|nvrtc|not found' >&2 || true
fi
if [ "${SLUICE_GPU_DRY:-0}" = 1 ]; then
  ctx=32 batches=1,4 steps=3 full_layers=2 big_layers=1 tokens=24 greedy=4 limit=600 concurrent=4
else
  ctx=512 batches=1,16,64 steps=32 full_layers= big_layers= tokens=96 greedy=24 limit=240 concurrent=16
fi
budget="${SLUICE_GPU_BUDGET_S:-0}"
deadline=0
[ "$budget" -gt 0 ] && deadline=$((SECONDS + budget))
results="$work/results"
mkdir -p "$results"

# The report: every step's answer so far, rewritten after each step so that a run stopped by
# an outer time limit still leaves what it measured.
report() {
  mkdir -p "$(dirname "$out")"
  python3 - "$results" "$device" "$backend" "${SLUICE_GPU_DRY:-0}" >"$out.tmp" <<'EOF'
import json, os, sys
results, device, backend, dry = sys.argv[1:5]
doc = {"device": device, "backend": backend, "dry_run": dry == "1", "gpu": None}
smi = os.path.join(results, "nvidia-smi.csv")
if os.path.exists(smi):
    rows = [r.split(", ") for r in open(smi).read().strip().splitlines() if r]
    doc["gpu"] = [dict(zip(["name", "compute_cap", "driver", "memory"], r)) for r in rows]
for f in sorted(os.listdir(results), key=lambda f: os.path.getmtime(os.path.join(results, f))):
    if f.endswith(".json"):
        text = open(os.path.join(results, f)).read().strip()
        try:
            doc[f[:-5]] = json.loads(text)
        except ValueError:
            doc[f[:-5]] = {"error": f"not JSON: {text[:500]}"}
print(json.dumps(doc, indent=1))
EOF
  mv "$out.tmp" "$out"
}

# step NAME TIMEOUT_S COMMAND...: runs a measurement, keeping its last stdout line (one JSON
# object) or its error. Under SLUICE_GPU_BUDGET_S a step gets at most the time left, and is
# skipped (and said so) when under 20 s are left.
step() {
  local name="$1" limit="$2"
  shift 2
  if [ "$deadline" -gt 0 ]; then
    local left=$((deadline - SECONDS))
    if [ "$left" -lt 20 ]; then
      echo "{\"error\": \"skipped: the ${budget} s budget was spent\"}" >"$results/$name.json"
      echo "check-gpu: $name: skipped (budget spent)" >&2
      report
      return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
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
    python3 - "$name" "$rc" "$results/$name.err" "$results/$name.out" >"$results/$name.json" <<'EOF'
import json, sys
name, rc = sys.argv[1], int(sys.argv[2])
err = open(sys.argv[3], errors="replace").read()
last = (open(sys.argv[4], errors="replace").read().strip().splitlines() or [""])[-1]
why = "timed out" if rc in (124, 137) else f"exit {rc}"
doc = {"error": f"{why}: {err.strip()[-2000:]}"}
try:
    doc["output"] = json.loads(last)
except ValueError:
    pass
print(json.dumps(doc))
EOF
  fi
  echo "check-gpu: $name: $((SECONDS - start)) s: $(head -c 300 "$results/$name.json")" >&2
  report
}

gpu=(--device "$device" --backend "$backend")
layers() { [ -n "$1" ] && echo "--layers $1"; }
# profile NAME MODEL: where a decode step's time goes, phase by phase (candle only).
profile() {
  if [ "$backend" = candle ]; then
    step "$1" "$limit" "$bin/gpucheck" --model "$2" "${gpu[@]}" profile \
      --batches "1,$(echo "$batches" | tr ',' '\n' | tail -n 1)" --ctx "$ctx" --steps 8
  fi
}
# attention NAME MODEL: the paged op against the gather path (candle on the device, whatever
# the backend under test).
attention() {
  step "$1" "$limit" "$bin/gpucheck" --model "$2" --device "$device" --backend candle attention \
    --tokens "$tokens" --batches "$batches" --ctx "$ctx" --steps "$steps"
}
# graphs NAME MODEL: decode steps replayed from CUDA graphs against eager ones (candle on the
# device, whatever the backend under test).
graphs() {
  step "$1" "$limit" "$bin/gpucheck" --model "$2" --device "$device" --backend candle graphs \
    --tokens "$tokens" --batches "$batches" --ctx "$ctx" --steps "$steps"
}
# host_copy NAME MODEL: logits copied through pageable memory, into page-locked buffers, and
# tokens picked on the device (candle on the device, whatever the backend under test), with
# greedy and sampled decode steps timed each way.
host_copy() {
  step "$1" "$limit" "$bin/gpucheck" --model "$2" --device "$device" --backend candle host-copy \
    --tokens "$tokens" --batches "$batches" --ctx "$ctx" --steps "$steps" --sampled
}
# serve NAME MODEL [VAR=VALUE...]: `sluice serve` on the device over HTTP
# (scripts/gpu-serve-check.py) with those variables set, when the carry holds the binary.
serve() {
  if [ -x "$bin/sluice" ]; then
    step "$1" "$limit" env "${@:3}" python3 "$root/scripts/gpu-serve-check.py" --bin "$bin/sluice" \
      --model "$2" --device "$device" --backend "$backend" --concurrent "$concurrent" \
      --max-tokens "$tokens"
  fi
}

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader \
    >"$results/nvidia-smi.csv" 2>&1 || true
  # The carry's kernels are machine code for one capability (scripts/check-cuda.sh).
  built="$(cat "$carry/compute_cap" 2>/dev/null || echo unknown)"
  found="$(head -n 1 "$results/nvidia-smi.csv" | cut -d, -f2 | tr -d ' .')"
  echo "{\"built_for\": \"$built\", \"device\": \"$found\"}" >"$results/compute_cap.json"
  if [ "$built" != unknown ] && [ "$built" != "$found" ]; then
    echo "check-gpu: warning: the binaries were built for compute capability $built, this GPU" \
      "is $found: rebuild with CUDA_COMPUTE_CAP=$found make check-cuda" >&2
  fi
fi

# In order of what matters most if the budget runs out: correctness on the device and the real
# model served over HTTP, then each shape's speed against the issue's targets (eager and with
# CUDA graphs), then where the time goes and the other comparisons.
step agree_truncated "$limit" "$bin/gpucheck" --model "$truncated" "${gpu[@]}" agree --tokens "$tokens"
serve serve_truncated "$truncated"
step identical_truncated "$limit" "$bin/gpucheck" --model "$truncated" "${gpu[@]}" identical --tokens "$greedy"
graphs graphs_truncated "$truncated"
serve serve_truncated_graphs "$truncated" SLUICE_CUDA_GRAPHS=1
step synth_small 120 "$bin/synth" --shape smollm2-135m --layers 2 --dtype q4_1 --seed 1 \
  --tokenizer-from "$truncated" --out "$work/synth-small.gguf"
step agree_synthetic "$limit" "$bin/gpucheck" --model "$work/synth-small.gguf" "${gpu[@]}" agree --tokens "$tokens"

# shellcheck disable=SC2046
step synth_smollm2 300 "$bin/synth" --shape smollm2-135m $(layers "$full_layers") --dtype q4_1 \
  --seed 2 --tokenizer-from "$truncated" --out "$work/smollm2.gguf"
step bench_smollm2 "$limit" "$bin/gpucheck" --model "$work/smollm2.gguf" "${gpu[@]}" bench \
  --batches "$batches" --ctx "$ctx" --steps "$steps"
graphs graphs_smollm2 "$work/smollm2.gguf"
step bench_smollm2_unsplit "$limit" env SLUICE_PAGED_SPLITS=0 "$bin/gpucheck" \
  --model "$work/smollm2.gguf" "${gpu[@]}" bench --batches 1 --ctx "$ctx" --steps "$steps"
# shellcheck disable=SC2046
step synth_llama3_8b 400 "$bin/synth" --shape llama3-8b $(layers "$big_layers") --dtype q4_k \
  --seed 3 --tokenizer-from "$truncated" --out "$work/llama3-8b.gguf"
step bench_llama3_8b "$limit" "$bin/gpucheck" --model "$work/llama3-8b.gguf" "${gpu[@]}" bench \
  --batches "$batches" --ctx "$ctx" --steps "$steps"
graphs graphs_llama3_8b "$work/llama3-8b.gguf"
step bench_llama3_8b_unsplit "$limit" env SLUICE_PAGED_SPLITS=0 "$bin/gpucheck" \
  --model "$work/llama3-8b.gguf" "${gpu[@]}" bench --batches 1 --ctx "$ctx" --steps "$steps"

profile profile_smollm2 "$work/smollm2.gguf"
attention attention_smollm2 "$work/smollm2.gguf"
step identical_smollm2 "$limit" "$bin/gpucheck" --model "$work/smollm2.gguf" "${gpu[@]}" identical --tokens "$greedy"
host_copy host_copy_smollm2 "$work/smollm2.gguf"
rm -f "$work/smollm2.gguf"
profile profile_llama3_8b "$work/llama3-8b.gguf"
attention attention_llama3_8b "$work/llama3-8b.gguf"
serve serve_llama3_8b "$work/llama3-8b.gguf"
step identical_llama3_8b "$limit" "$bin/gpucheck" --model "$work/llama3-8b.gguf" "${gpu[@]}" identical --tokens "$greedy"
host_copy host_copy_llama3_8b "$work/llama3-8b.gguf"
rm -f "$work/llama3-8b.gguf"
report
echo "check-gpu: wrote $out"
