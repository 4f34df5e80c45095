#!/usr/bin/env bash
# `make check-cuda`: builds the `sluice` binary with `--features cuda` on a machine without a
# GPU or a CUDA install, so the GPU code (candle's CUDA backend and its .cu kernels, compiled by
# nvcc) at least compiles and links. The toolkit comes from PyPI's NVIDIA wheels, pinned,
# installed into target/cuda-venv, whose nvidia/cu13 folder is laid out as a CUDA_HOME.
#
# The one piece no wheel ships is the driver's libcuda.so (it comes with the GPU driver, never
# with the toolkit). Linking needs one, so a stub is generated from the driver API cudarc
# declares: every `cu*` entry point as an empty function, which is what the toolkit's own
# lib64/stubs/libcuda.so is. The binary is linked against it and never runs with it: on a GPU
# node the real libcuda.so.1 comes from the driver.
#
# It builds in release (one nvcc pass over candle's kernels serves all three binaries) and
# assembles target/gpu-carry, what `make check-gpu` runs on a GPU machine without Rust: `sluice`
# and the `gpucheck` and `synth` examples built with `--features cuda`, stripped and xz'd,
# and the default model cut to its embeddings and first 4 layers (under 64 MiB in all).
#
# Not in CI: building candle with nvcc from scratch takes far longer than CI's budget on two
# cores. Output goes to target/cuda (its own target dir, so the CPU builds are left alone).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

# PyPI ships a complete nvcc (the driver program, cicc, crt headers) only from CUDA 13 on: the
# cu12 nvcc wheels hold ptxas alone. So this check compiles with CUDA 13.0 while the image
# builds with the CUDA_VERSION in deploy/docker/Dockerfile.cuda (deploy/README.md says why).
CUDA_PKGS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-nvrtc==13.0.88
  nvidia-cublas==13.0.2.14
  nvidia-curand==10.4.0.35
)
# candle's quantized matmul kernels are linked as machine code for this one capability (no PTX
# to fall back on), so the binaries run on GPUs of exactly this capability: 89 for an L4, 90
# for an H100 or H200 (`CUDA_COMPUTE_CAP=90 make check-cuda`). Changing it rebuilds candle's
# kernels (most of this script's time).
CAP="${CUDA_COMPUTE_CAP:-89}"
venv="$root/target/cuda-venv"
stamp="$venv/.packages"

if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "${CUDA_PKGS[*]}" ]; then
  echo "check-cuda: installing ${CUDA_PKGS[*]} into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${CUDA_PKGS[@]}"
  echo "${CUDA_PKGS[*]}" >"$stamp"
fi

# The CUDA 13 wheels all install into one tree, nvidia/cu13/{bin,include,lib,nvvm}: a CUDA_HOME.
tk="$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')"
if [ ! -x "$tk/bin/nvcc" ]; then
  echo "error: $tk/bin/nvcc is missing: the nvidia-cuda-nvcc wheel's layout changed?" >&2
  exit 1
fi
if [ ! -f "$tk/lib/stubs/libcuda.so" ]; then
  # The wheels ship versioned libraries only (libcudart.so.13); the linker wants libX.so.
  for so in "$tk"/lib/*.so.*; do
    base="$(basename "$so")"
    [ -e "$tk/lib/${base%%.so.*}.so" ] || ln -s "$base" "$tk/lib/${base%%.so.*}.so"
  done
  # The driver stub (see the header): every cu* function cudarc declares, empty.
  cudarc_manifest="$(cargo metadata --format-version 1 --locked --features sluice-gateway/cuda |
    "$venv/bin/python" -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"]=="cudarc"))')"
  mkdir -p "$tk/lib/stubs"
  grep -ohE '\bfn cu[A-Za-z0-9_]+\s*\(' "$(dirname "$cudarc_manifest")/src/driver/sys/mod.rs" |
    sed -E 's/^fn (cu[A-Za-z0-9_]+).*/void \1(void) {}/' | sort -u >"$tk/lib/stubs/libcuda.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$tk/lib/stubs/libcuda.so" "$tk/lib/stubs/libcuda.c"
fi

# The binary asks the loader for the soname, libcuda.so.1.
ln -sf libcuda.so "$tk/lib/stubs/libcuda.so.1"

export CUDA_HOME="$tk" CUDA_PATH="$tk" NVCC="$tk/bin/nvcc" CUDA_COMPUTE_CAP="$CAP"
export PATH="$tk/bin:$PATH"
export CARGO_TARGET_DIR="$root/target/cuda"
"$NVCC" --version | tail -n 2
echo "check-cuda: cargo build --release: sluice, and the gpucheck and synth examples, with cuda" \
  "(compute capability $CAP)"
start=$SECONDS
cargo build --locked --release -p sluice-gateway --bin sluice --features sluice-gateway/cuda \
  -p sluice-models --example gpucheck --example synth --features sluice-models/cuda
echo "check-cuda: built in $((SECONDS - start)) s"
carry="$root/target/gpu-carry"
rm -rf "$carry"
mkdir -p "$carry/bin" "$carry/models"
echo "$CAP" >"$carry/compute_cap"
# Stripped and xz-compressed (half gzip's size on candle's embedded PTX; the three binaries
# and the model must fit in a device run's 64 MiB): check-gpu.sh unpacks them.
for b in examples/gpucheck examples/synth sluice; do
  strip -o "$carry/bin/${b#examples/}" "$CARGO_TARGET_DIR/release/$b"
  xz -9e -T0 "$carry/bin/${b#examples/}"
done
# The truncated model is written by a CPU build of synth (same code, no CUDA needed to run).
model_dir="${SLUICE_MODEL_DIR:-$root/models/cache}"
env -u CUDA_HOME -u CUDA_PATH -u NVCC -u CUDA_COMPUTE_CAP -u CARGO_TARGET_DIR \
  cargo run --locked -q -p sluice-models --example synth -- \
  --truncate-from "$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf" --layers 4 \
  --out "$carry/models/smollm2-4l.gguf"
size=$(du -sb "$carry" | cut -f1)
du -ah "$carry"
if [ "$size" -gt $((64 << 20)) ]; then
  echo "error: $carry is $((size >> 20)) MiB, over the 64 MiB a device run carries" >&2
  exit 1
fi

bin="$CARGO_TARGET_DIR/release/sluice"
echo "check-cuda: $bin links:"
LD_LIBRARY_PATH="$tk/lib:$tk/lib/stubs" ldd "$bin" | grep -E 'cuda|cublas|curand|nvrtc|cudart'
# The CUDA build parses and validates flags like the CPU one (no GPU is opened for this).
LD_LIBRARY_PATH="$tk/lib:$tk/lib/stubs" "$bin" serve --check-config --model smollm2-135m-instruct \
  --device cuda:0 >/dev/null

echo "check-cuda: ok ($carry: $((size >> 20)) MiB; on the GPU machine: make check-gpu)"
