#!/usr/bin/env bash
# A real systemd for the e2e tests that install the rendered units (tests/e2e/nspawn_runtime.py). Called by
# tools/ci-services.sh (as root, before `make test`), the same tolerant way as tools/pod-runtime.sh.
#
# Per machine, once:
#   - installs (only when missing) systemd-container mmdebstrap, --no-install-recommends;
#   - builds a minimal Debian bookworm root WITH systemd as PID 1 material (systemd, systemd-sysv, dbus) with
#     mmdebstrap from this machine's own Debian mirror lines, and keeps it as a directory:
#     $DEPLOYKIT_CI_CACHE/nspawn-bookworm (default /var/cache/deploykit-ci). The tests boot it with
#     `systemd-nspawn --volatile=overlay`, so it is never written to;
#   - checks that systemd-nspawn boots it to "running" (its own /tmp, a private network, powered off again)
#     and writes $DEPLOYKIT_CI_CACHE/nspawn-root.status: `status=ready` with the systemd version inside, or
#     `status=unavailable` with a `reason=` line, which the tests print when they skip.
# Idempotent: when the status says ready for the same recipe, root and systemd-nspawn, it returns in about a
# second. Tolerant: whatever fails, it prints why, records it in the status file and exits 0.
# Never boots systemd in a namespace that shares the host's /tmp (its tmpfiles would empty it): only
# systemd-nspawn, which gives the container its own /tmp.
set -uo pipefail

CACHE_DIR=${DEPLOYKIT_CI_CACHE:-/var/cache/deploykit-ci}
ROOT=$CACHE_DIR/nspawn-bookworm
STATUS=$CACHE_DIR/nspawn-root.status
SUITE=bookworm
# systemd, systemd-sysv, dbus: a booting systemd with systemctl/journalctl. python3, curl, procps, iproute2:
# probes run inside. libnuma1 and g++: the host venv's CPU vLLM links libnuma and compiles a kernel with the
# C++ compiler on its first logprobs request; openssl: torch inductor checksums its precompiled header with
# `openssl` on that same request (without it the request fails with HTTP 500, measured in nspawn).
INCLUDE=systemd,systemd-sysv,dbus,python3,iproute2,procps,curl,libnuma1,g++,openssl
# Bump when the root's recipe changes: a cached root of another recipe is rebuilt.
RECIPE="v2 minbase $SUITE $INCLUDE root0755 nodocs"
PACKAGES=(systemd-container mmdebstrap)
MIN_DISK_MB=${DEPLOYKIT_NSPAWN_MIN_DISK_MB:-2048}
MIN_MEM_MB=${DEPLOYKIT_NSPAWN_MIN_MEM_MB:-1024}

START_NS=$(date +%s%N)
log() { echo "nspawn-root: $*"; }
elapsed() { echo "$(( ($(date +%s%N) - $1) / 1000000 )) ms"; }

write_status() { # status reason [key=value...]
  local status=$1 reason=$2 tmp
  shift 2
  mkdir -p "$CACHE_DIR" 2>/dev/null || return 0
  tmp=$STATUS.tmp.$$
  {
    echo "status=$status"
    echo "reason=${reason//$'\n'/ }"
    echo "checked=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    for kv in "$@"; do echo "$kv"; done
  } >"$tmp" 2>/dev/null && mv -f "$tmp" "$STATUS" 2>/dev/null
  return 0
}

not_ready() {
  log "NOT READY: $* (the systemd unit tests will skip with this reason)"
  write_status unavailable "$*"
  exit 0
}

status_value() { # key
  [ -r "$STATUS" ] && sed -n "s/^$1=//p" "$STATUS" | head -n 1
}

nspawn_version() { systemd-nspawn --version 2>/dev/null | awk 'NR == 1 {print $2}'; }

# ---------------------------------------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || not_ready "tools/nspawn-root.sh must run as root (systemd-nspawn)"

if command -v systemd-nspawn >/dev/null && command -v nsenter >/dev/null \
  && [ "$(status_value status)" = ready ] && [ "$(status_value recipe)" = "$RECIPE" ] \
  && [ -x "$ROOT/lib/systemd/systemd" ] && [ "$(cat "$ROOT.recipe" 2>/dev/null)" = "$RECIPE" ] \
  && [ "$(status_value nspawn)" = "$(nspawn_version)" ]; then
  log "ready (cached: $ROOT, systemd $(status_value systemd) inside) in $(elapsed "$START_NS")"
  exit 0
fi

[ -f /etc/debian_version ] && command -v apt-get >/dev/null || not_ready "not a Debian machine with apt-get"
mkdir -p "$CACHE_DIR" || not_ready "cannot create $CACHE_DIR"

# One run at a time per machine (two CI jobs on one machine share the cache); a lock of its own, so that it
# never waits for tools/pod-runtime.sh.
exec 9>"$CACHE_DIR/.nspawn.lock"
flock -w 600 9 || not_ready "another tools/nspawn-root.sh held $CACHE_DIR/.nspawn.lock for 10 minutes"

avail_mb=$(df -Pm "$CACHE_DIR" | awk 'NR == 2 {print $4}')
mem_mb=$(free -m | awk '/^Mem:/ {print $7}')
log "free: ${avail_mb} MB disk at $CACHE_DIR, ${mem_mb} MB memory available"
[ "${avail_mb:-0}" -ge "$MIN_DISK_MB" ] \
  || not_ready "only ${avail_mb} MB free at $CACHE_DIR (need $MIN_DISK_MB MB: root ~450 MB, overlays in the tests)"
[ "${mem_mb:-0}" -ge "$MIN_MEM_MB" ] || not_ready "only ${mem_mb} MB memory available (need $MIN_MEM_MB MB)"

# --- packages ---------------------------------------------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  t=$(date +%s%N)
  log "installing ${missing[*]} (--no-install-recommends)"
  aptlog=$CACHE_DIR/apt-nspawn.log
  export DEBIAN_FRONTEND=noninteractive
  timeout 180 apt-get -o DPkg::Lock::Timeout=120 update -qq >"$aptlog" 2>&1 \
    || not_ready "apt-get update failed: $(tail -n 2 "$aptlog")"
  timeout 300 apt-get -o DPkg::Lock::Timeout=120 install -y -qq --no-install-recommends "${missing[@]}" >>"$aptlog" 2>&1 \
    || not_ready "apt-get install ${missing[*]} failed: $(tail -n 2 "$aptlog")"
  log "installed ${missing[*]} in $(elapsed "$t")"
fi
command -v systemd-nspawn >/dev/null || not_ready "systemd-nspawn is not on PATH after installing systemd-container"
command -v nsenter >/dev/null || not_ready "nsenter (util-linux) is not on PATH"

# --- the Debian root --------------------------------------------------------------------------------------
# The machine's own Debian mirrors: debian_mirrors, shared with the other root-building script.
# shellcheck source=tools/debian-mirrors.sh
. "$(dirname "${BASH_SOURCE[0]}")/debian-mirrors.sh"

work=""
cleanup_work() { [ -n "$work" ] && rm -rf --one-file-system "$work"; return 0; }
trap cleanup_work EXIT
if [ ! -x "$ROOT/lib/systemd/systemd" ] || [ "$(cat "$ROOT.recipe" 2>/dev/null)" != "$RECIPE" ]; then
  mapfile -t mirrors < <(debian_mirrors)
  [ ${#mirrors[@]} -gt 0 ] || not_ready "no Debian mirror lines found in /etc/apt/sources.list(.d)"
  log "building the $SUITE root (with systemd) with mmdebstrap from: ${mirrors[*]}"
  aptopts=$CACHE_DIR/apt-host-nspawn.conf
  apt-config dump 2>/dev/null | grep -E '^Acquire::((https?|ftp)::Proxy|Check-Valid-Until|Check-Date) ' >"$aptopts" || true
  work=$CACHE_DIR/nspawn-build.$$
  rm -rf --one-file-system "$work" && mkdir -p "$work/tmp"
  t=$(date +%s%N)
  # /root 0755: the host's Python prefix (pyenv: /root/.pyenv/...) is bound at the same path inside, and the
  # service user must be able to walk through /root to reach it. An empty machine-id: systemd makes one at
  # boot (nspawn passes the container a fresh id).
  if TMPDIR=$work/tmp timeout 600 mmdebstrap --variant=minbase --format=directory --include="$INCLUDE" \
    --aptopt="$aptopts" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='chmod 0755 "$1/root"' \
    --customize-hook='rm -f "$1/etc/machine-id" "$1/var/lib/dbus/machine-id"; : >"$1/etc/machine-id"' \
    --customize-hook='rm -rf "$1/var/cache/apt/archives/"*.deb "$1/var/lib/apt/lists/"*' \
    "$SUITE" "$work/root" "${mirrors[@]}" >"$CACHE_DIR/mmdebstrap-nspawn.log" 2>&1; then
    # Atomically: a half-built root never has the final name; an old one is moved away first, then removed.
    old=$CACHE_DIR/nspawn-old.$$
    rm -f "$ROOT.recipe"
    if [ -e "$ROOT" ]; then mv "$ROOT" "$old" || not_ready "cannot move the old $ROOT away"; fi
    mv "$work/root" "$ROOT" && echo "$RECIPE" >"$ROOT.recipe" || not_ready "cannot store $ROOT"
    rm -rf --one-file-system "$old"
  else
    not_ready "mmdebstrap failed (see $CACHE_DIR/mmdebstrap-nspawn.log): $(tail -n 2 "$CACHE_DIR/mmdebstrap-nspawn.log")"
  fi
  cleanup_work
  work=""
  log "built $ROOT ($(du -sm "$ROOT" | cut -f1) MB) in $(elapsed "$t")"
fi

# --- systemd-nspawn boots it ------------------------------------------------------------------------------
# The same flags as tests/e2e/nspawn_runtime.py: its own /tmp, a private network (loopback only), the root
# never written (--volatile=overlay), no machined registration (there is none on this kind of host).
t=$(date +%s%N)
bootlog=$CACHE_DIR/nspawn-check.log
systemd-nspawn -q -D "$ROOT" --boot --register=no --keep-unit --private-network --volatile=overlay \
  --console=passive >"$bootlog" 2>&1 &
npid=$!
leader=""
stop_check() {
  [ -n "$leader" ] && timeout 20 nsenter -t "$leader" -a systemctl poweroff >/dev/null 2>&1
  for _ in $(seq 1 100); do kill -0 "$npid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$npid" 2>/dev/null && kill -KILL "$npid" 2>/dev/null
  wait "$npid" 2>/dev/null
  return 0
}
trap stop_check EXIT
for _ in $(seq 1 150); do
  leader=$(ps -o pid= --ppid "$npid" 2>/dev/null | head -n 1 | tr -d ' ')
  [ -n "$leader" ] && [ "$(readlink "/proc/$leader/exe" 2>/dev/null)" = /usr/lib/systemd/systemd ] && break
  [ -n "$leader" ] && [ "$(readlink "/proc/$leader/exe" 2>/dev/null)" = /lib/systemd/systemd ] && break
  kill -0 "$npid" 2>/dev/null || not_ready "systemd-nspawn exited at once: $(tail -n 3 "$bootlog")"
  leader=""
  sleep 0.2
done
[ -n "$leader" ] || not_ready "systemd-nspawn started no systemd within 30 s: $(tail -n 3 "$bootlog")"
state=$(timeout 120 nsenter -t "$leader" -a systemctl is-system-running --wait 2>&1)
version=$(nsenter -t "$leader" -a systemctl --version 2>/dev/null | awk 'NR == 1 {print $2}')
failed=$(nsenter -t "$leader" -a systemctl --failed --no-legend --plain 2>/dev/null | awk '{print $1}' | tr '\n' ' ')
[ "$state" = running ] || { stop_check; not_ready "the container's systemd did not reach running: $state (failed: $failed)"; }
log "booted to running (systemd $version) in $(elapsed "$t")"
stop_check
trap - EXIT
log "powered off in $(elapsed "$t") since boot"

write_status ready "" "recipe=$RECIPE" "root=$ROOT" "systemd=$version" "nspawn=$(nspawn_version)"
log "ready: $ROOT, systemd $version inside (total $(elapsed "$START_NS"))"
