#!/bin/sh
# The CUDA image's `sluice`: runs the build for this GPU's compute capability, from
# $SLUICE_CUDA_CAP (the overlays set it), else what nvidia-smi reports, else the first built.
set -eu
dir=/opt/sluice
cap="${SLUICE_CUDA_CAP:-}"
if [ -z "$cap" ] && command -v nvidia-smi >/dev/null 2>&1; then
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')" || cap=""
fi
if [ -z "$cap" ] || [ ! -x "$dir/sm_$cap/sluice" ]; then
  first="$(ls "$dir" | head -n 1)"
  [ -n "${SLUICE_CUDA_CAP:-}" ] && echo "sluice: no build for compute capability $SLUICE_CUDA_CAP in $dir; using $first" >&2
  cap="${first#sm_}"
fi
exec "$dir/sm_$cap/sluice" "$@"
