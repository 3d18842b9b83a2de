#!/usr/bin/env bash
# The Python sources of every supported vLLM release that has no CPU build, for tests/vllm_releases.
#
# vLLM 0.32 is tested from the CPU build installed in .venv. vLLM 0.33 and 0.34 have no CPU build: their
# CUDA wheels (~336 MB, ~239 MB) are fetched from PyPI with a pinned sha256, and only its Python sources and data files are
# unpacked; its compiled CUDA extensions (*.so) are left out on purpose, so that any test that would
# reach a compiled kernel fails on an ImportError instead of running something this machine cannot run
# (the list of what was left out is written next to the sources: COMPILED-LEFT-OUT.txt).
#
# Cache: $DEPLOYKIT_VLLM_SOURCES_DIR, else /var/cache/deploykit-ci/vllm-sources when writable, else the
# checkout's .deploykit-cache/vllm-sources. Idempotent: a complete unpacked tree is reused (a few ms).
# Prints the cache folder on its last line.
set -euo pipefail

cd "$(dirname "$0")/.."
# Any Python with pip: the checkout's venv when there is one (.ci/run calls this before `make` builds it).
if [ -z "${PYTHON:-}" ]; then
  PYTHON=.venv/bin/python
  [ -x "$PYTHON" ] || PYTHON=$(command -v python3.11 || command -v python3)
fi

# version  wheel file  sha256: tools/vllm-wheels.txt (`make vllm-release VERSION=X` adds a line)
mapfile -t RELEASES < <(grep -v '^[[:space:]]*\(#\|$\)' tools/vllm-wheels.txt)

if [ -n "${DEPLOYKIT_VLLM_SOURCES_DIR:-}" ]; then
  CACHE=$DEPLOYKIT_VLLM_SOURCES_DIR
elif mkdir -p /var/cache/deploykit-ci/vllm-sources 2>/dev/null && [ -w /var/cache/deploykit-ci/vllm-sources ]; then
  CACHE=/var/cache/deploykit-ci/vllm-sources
else
  CACHE=$PWD/.deploykit-cache/vllm-sources
fi
mkdir -p "$CACHE"

for release in "${RELEASES[@]}"; do
  read -r version wheel sha256 <<<"$release"
  tree="$CACHE/vllm-$version"
  if [ -f "$tree/.complete" ] && [ "$(cat "$tree/.complete")" = "$sha256" ]; then
    continue
  fi
  wheels="$CACHE/wheels"
  mkdir -p "$wheels"
  echo "fetch-vllm-sources: vLLM $version ($wheel)" >&2
  if ! [ -f "$wheels/$wheel" ] || ! echo "$sha256  $wheels/$wheel" | sha256sum -c --quiet - 2>/dev/null; then
    rm -f "$wheels/$wheel"
    requirement=$(mktemp)
    echo "vllm==$version --hash=sha256:$sha256" >"$requirement"
    "$PYTHON" -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
      --index-url https://pypi.org/simple -r "$requirement" -d "$wheels"
    rm -f "$requirement"
  fi
  echo "$sha256  $wheels/$wheel" | sha256sum -c --quiet -
  rm -rf "$tree" "$tree.partial"
  mkdir -p "$tree.partial"
  "$PYTHON" - "$wheels/$wheel" "$tree.partial" <<'PY'
import sys
import zipfile
from pathlib import PurePosixPath

wheel, target = sys.argv[1], sys.argv[2]
left_out = []
with zipfile.ZipFile(wheel) as archive:
    for member in archive.infolist():
        path = PurePosixPath(member.filename)
        if path.parts[0] not in ("vllm",) and not path.parts[0].endswith(".dist-info"):
            continue  # other top-level packages of the wheel (compiled kernels' helpers) stay out too
        if ".so" in path.suffixes or path.suffix in (".cubin", ".fatbin"):
            left_out.append(member.filename)
            continue
        archive.extract(member, target)
with open(f"{target}/COMPILED-LEFT-OUT.txt", "w") as listing:
    listing.write("\n".join(sorted(left_out)) + "\n")
PY
  echo "$sha256" >"$tree.partial/.complete"
  mv "$tree.partial" "$tree"
done
echo "$CACHE"
