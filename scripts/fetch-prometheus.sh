#!/usr/bin/env bash
# Fetch a real Prometheus server for the autoscaler's Prometheus-source test
# (autoscaler/tests/prometheus_source.rs): Debian's package, downloaded with `apt-get download`
# and unpacked into target/prometheus without installing it (no root, no service started).
# The version is pinned by the .deb's sha256; idempotent once the binary is there.
set -euo pipefail

VERSION="2.42.0+ds-5+b6"
DEB_SHA256="3b0e0255b059a7696bd4a139a4a4eb24d71df067936a61ece5093559cbc7991c"

root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/target/prometheus"
bin="$dir/usr/bin/prometheus"
stamp="$dir/.version"

if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$VERSION" ]; then
  echo "prometheus: $bin ($VERSION)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: fetching Prometheus needs apt-get (Debian's package $VERSION);" >&2
  echo "       or point SLUICE_PROMETHEUS at a prometheus 2.x binary." >&2
  exit 1
fi
rm -rf "$dir"
mkdir -p "$dir/deb"
(cd "$dir/deb" && apt-get download -q "prometheus=$VERSION" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
deb="$(ls "$dir"/deb/prometheus_*.deb 2>/dev/null | head -n 1)"
if [ -z "$deb" ]; then
  echo "error: apt-get download prometheus=$VERSION fetched nothing (run apt-get update?)" >&2
  exit 1
fi
if [ "$(sha256sum "$deb" | cut -d' ' -f1)" != "$DEB_SHA256" ]; then
  echo "error: $deb has an unexpected sha256" >&2
  exit 1
fi
dpkg -x "$deb" "$dir"
rm -rf "$dir/deb" "$dir/usr/share"
echo "$VERSION" >"$stamp"
echo "prometheus: $bin ($("$bin" --version 2>&1 | head -n 1))"
