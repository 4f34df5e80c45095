#!/usr/bin/env bash
# Creates (or reuses) the venv the end-to-end tests run in, with the pinned clients of
# tests/python/requirements.txt. Reused only while the requirements file is unchanged.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SLUICE_TEST_VENV:-$root/target/pyvenv}"
req="$root/tests/python/requirements.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req"
echo "$want" > "$stamp"
