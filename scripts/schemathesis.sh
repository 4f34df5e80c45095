#!/usr/bin/env bash
# Property-based API testing: schemathesis generates requests from /openapi.json and fails
# on any 5xx. The server runs with a short context so generated requests stay cheap.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SLUICE_TEST_VENV:-$root/target/pyvenv}"
bin="${SLUICE_BIN:-$root/target/debug/sluice}"
out="$(mktemp)"
"$bin" serve --port 0 --max-model-len 64 --model-dir "${SLUICE_MODEL_DIR:-$root/models/cache}" \
  >"$out" 2>/dev/null &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 1 600); do
  url="$(sed -n 's/^sluice listening on //p' "$out")"
  if [ -n "$url" ] && curl -sf "$url/ready" >/dev/null; then break; fi
  kill -0 $pid 2>/dev/null || { echo "sluice exited before it was ready"; exit 1; }
  sleep 0.1
done
"$venv/bin/schemathesis" run "$url/openapi.json" --url "$url" \
  --checks not_a_server_error --max-examples "${SCHEMATHESIS_EXAMPLES:-40}" --no-color
