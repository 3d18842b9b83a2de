#!/usr/bin/env bash
# Run here (not on the device): fill .gpu-carry/ with what bench/gpu/run.py needs on the GPU machine,
# which has torch/triton/transformers but no vLLM and no network.
#   .gpu-carry/vllm/              vLLM's .py sources from this venv (no compiled extensions; unused model
#                                 files left out), about 20 MB
#   .gpu-carry/vllm-version.txt   the version those sources are
#   .gpu-carry/vllm-compiled.txt  the compiled extension modules left behind (the kit stands in for them)
#   .gpu-carry/wheels/            pure-Python / cp312 wheels the GPU image lacks
# Usage: bash bench/gpu/prepare.sh [VENV]   (VENV defaults to /work/main/.venv, else ./.venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-}"
if [ -z "$VENV" ]; then
  if [ -x /work/main/.venv/bin/python ]; then VENV=/work/main/.venv; else VENV=.venv; fi
fi
PY="$VENV/bin/python"
SRC="$("$PY" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("vllm").origin))')"
DEST=.gpu-carry
# .prepared is written last: a run cut short (or still going) leaves none, and the next one starts over.
rm -f "$DEST/.prepared"
rm -rf "$DEST/vllm"
FILES="$(mktemp)"
trap 'rm -f "$FILES"' EXIT
mkdir -p "$DEST/vllm" "$DEST/wheels"

# Model files: only what the Gemma4 Unified embedder's import chain needs (the rest is ~7 MB).
KEEP_MODELS='^model_executor/models/(__init__|adapters|config|gemma[^/]*|interfaces[^/]*|module_mapping|registry|utils|vision|whisper[^/]*)\.py$|^model_executor/models/transformers/'
(cd "$SRC" && find . -name '*.py' -printf '%P\n') \
  | grep -Ev '^(benchmarks|models/[^/]+/)' \
  | grep -Ev '^model_executor/models/' > "$FILES"
(cd "$SRC" && find model_executor/models -name '*.py') | grep -E "$KEEP_MODELS" >> "$FILES"
tar -C "$SRC" -cf - -T "$FILES" | tar -C "$DEST/vllm" -xf -
# Non-Python data some modules read at import (json configs next to the sources).
(cd "$SRC" && find . -name '*.json' -size -64k -printf '%P\n') \
  | grep -Ev '^(benchmarks|model_executor/layers/fused_moe/configs|model_executor/layers/quantization/utils/configs)/' \
  > /tmp/gpu-carry-json.txt || true
tar -C "$SRC" -cf - -T /tmp/gpu-carry-json.txt | tar -C "$DEST/vllm" -xf -
"$PY" -c 'import importlib.metadata as m; print(m.version("vllm"))' > "$DEST/vllm-version.txt"
(cd "$SRC" && find . -name '*.so' -printf '%P\n' | sed -e 's#\.[^/]*\.so$##' -e 's#/#.#g' -e 's#^#vllm.#') > "$DEST/vllm-compiled.txt"

# Wheels for CPython 3.12 on x86-64 (the versions this venv runs), missing from the GPU image (KINDS.md).
WHEELS="pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
cachetools==8.0.2 msgspec==0.23.0 cbor2==6.3.0 dill==0.4.1 pyzmq==27.3.0 pybase64==1.5.1
platformdirs==4.14.9 more-itertools openai==3.57.0 jiter==0.19.0 distro"
for spec in $WHEELS; do
  name="${spec%%==*}"
  if ls "$DEST/wheels/" 2>/dev/null | grep -qi "^$(echo "$name" | tr - _)-"; then continue; fi
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_26_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 \
    -d "$DEST/wheels" "$spec" || echo "prepare.sh: could not download $spec (the kit stands in for it)" >&2
done
du -sh "$DEST/vllm" "$DEST/wheels"
echo "vLLM $(cat "$DEST/vllm-version.txt") sources: $(wc -l < "$FILES") files"
touch "$DEST/.prepared"
