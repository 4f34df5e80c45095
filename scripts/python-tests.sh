#!/usr/bin/env bash
# The end-to-end tests: the real `sluice` binary with the real model, driven by the official
# `openai` client (pytest), then schemathesis against /openapi.json (no 5xx allowed).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SLUICE_TEST_VENV:-$root/target/pyvenv}"
"$root/scripts/python-venv.sh"
export SLUICE_BIN="${SLUICE_BIN:-$root/target/debug/sluice}"
# SLUICE_TEST_BACKEND=candle runs every server here on the candle backend (`sluice serve` reads
# SLUICE_BACKEND); the default is the CPU kernels.
export SLUICE_BACKEND="${SLUICE_TEST_BACKEND:-${SLUICE_BACKEND:-kernels}}"
echo "python tests: sluice serve --backend $SLUICE_BACKEND"
"$venv/bin/python" -m pytest -q "$root/tests/python"
# SLUICE_PYTEST_ONLY=1 skips schemathesis (the second, candle-backend pass of `make test`: the
# API's shape does not depend on the backend).
if [ "${SLUICE_PYTEST_ONLY:-0}" != 1 ]; then
  "$root/scripts/schemathesis.sh"
fi
