#!/usr/bin/env bash
# A container runtime for the e2e tests that play the rendered Helm pod in real podman
# (tests/e2e/pod_runtime.py). Called by tools/ci-services.sh (as root, before `make test`).
#
# Per machine, once:
#   - installs (only when missing) podman runc catatonit mmdebstrap, --no-install-recommends
#     (rootful podman with host networking needs neither uidmap nor slirp4netns);
#   - builds a minimal Debian bookworm root with mmdebstrap from this machine's own Debian mirror lines
#     and keeps it as a tarball: $DEPLOYKIT_CI_CACHE/rootfs-bookworm.tar (default /var/cache/deploykit-ci);
#   - checks that podman runs a container from it (runc, cgroupfs, the ulimits this kind of VM allows)
#     and writes $DEPLOYKIT_CI_CACHE/pod-runtime.status: `status=ready`, or `status=unavailable` with a
#     `reason=` line, which the tests print when they skip.
# Idempotent: when the status says ready for the same recipe, rootfs and podman, it returns in about a
# second. Tolerant: whatever fails, it prints why, records it in the status file and exits 0, so the
# tests skip with that reason instead of the CI run failing here.
set -uo pipefail

CACHE_DIR=${DEPLOYKIT_CI_CACHE:-/var/cache/deploykit-ci}
ROOTFS=$CACHE_DIR/rootfs-bookworm.tar
STATUS=$CACHE_DIR/pod-runtime.status
SUITE=bookworm
# python3 and curl: podman turns liveness probes into healthcheck commands (httpGet → curl). libnuma1 and
# g++: the CPU build of vLLM (from the host venv the pods mount) links libnuma and compiles a kernel with the
# C++ compiler on its first logprobs request (without one the engine core dies); vLLM's own CPU image has both.
INCLUDE=python3,curl,ca-certificates,procps,iproute2,libnuma1,g++
# Bump when the root's recipe changes: a cached tarball of another recipe is rebuilt.
RECIPE="v1 minbase $SUITE $INCLUDE root0755 nodocs"
PACKAGES=(podman runc catatonit mmdebstrap)
MIN_DISK_MB=${DEPLOYKIT_POD_MIN_DISK_MB:-2048}
MIN_MEM_MB=${DEPLOYKIT_POD_MIN_MEM_MB:-1024}

START_NS=$(date +%s%N)
log() { echo "pod-runtime: $*"; }
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
  log "NOT READY: $* (the pod tests will skip with this reason)"
  write_status unavailable "$*"
  exit 0
}

status_value() { # key
  [ -r "$STATUS" ] && sed -n "s/^$1=//p" "$STATUS" | head -n 1
}

podman_version() { podman --version 2>/dev/null | awk '{print $NF}'; }

# ---------------------------------------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || not_ready "tools/pod-runtime.sh must run as root (rootful podman)"

# Fast path: everything is there and was checked for this recipe, this tarball and this podman.
if command -v podman >/dev/null && command -v runc >/dev/null && command -v catatonit >/dev/null \
  && [ "$(status_value status)" = ready ] && [ "$(status_value recipe)" = "$RECIPE" ] && [ -f "$ROOTFS" ] \
  && [ "$(status_value rootfs_bytes)" = "$(stat -c %s "$ROOTFS")" ] \
  && [ "$(status_value podman)" = "$(podman_version)" ]; then
  log "ready (cached: $ROOTFS, podman $(podman_version)) in $(elapsed "$START_NS")"
  exit 0
fi

[ -f /etc/debian_version ] && command -v apt-get >/dev/null || not_ready "not a Debian machine with apt-get"
mkdir -p "$CACHE_DIR" || not_ready "cannot create $CACHE_DIR"

# One run at a time per machine (two CI jobs on one machine share the cache).
exec 9>"$CACHE_DIR/.lock"
flock -w 600 9 || not_ready "another tools/pod-runtime.sh held $CACHE_DIR/.lock for 10 minutes"

avail_mb=$(df -Pm "$CACHE_DIR" | awk 'NR == 2 {print $4}')
mem_mb=$(free -m | awk '/^Mem:/ {print $7}')
log "free: ${avail_mb} MB disk at $CACHE_DIR, ${mem_mb} MB memory available"
[ "${avail_mb:-0}" -ge "$MIN_DISK_MB" ] \
  || not_ready "only ${avail_mb} MB free at $CACHE_DIR (need $MIN_DISK_MB MB: rootfs ~200 MB, build ~400 MB, pods ~400 MB)"
[ "${mem_mb:-0}" -ge "$MIN_MEM_MB" ] || not_ready "only ${mem_mb} MB memory available (need $MIN_MEM_MB MB)"

# --- packages ---------------------------------------------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  t=$(date +%s%N)
  log "installing ${missing[*]} (--no-install-recommends)"
  aptlog=$CACHE_DIR/apt.log
  export DEBIAN_FRONTEND=noninteractive
  timeout 180 apt-get -o DPkg::Lock::Timeout=120 update -qq >"$aptlog" 2>&1 \
    || not_ready "apt-get update failed: $(tail -n 2 "$aptlog")"
  timeout 300 apt-get -o DPkg::Lock::Timeout=120 install -y -qq --no-install-recommends "${missing[@]}" >>"$aptlog" 2>&1 \
    || not_ready "apt-get install ${missing[*]} failed: $(tail -n 2 "$aptlog")"
  log "installed ${missing[*]} in $(elapsed "$t")"
fi
command -v podman >/dev/null || not_ready "podman is not on PATH after installing it"

# --- the Debian root --------------------------------------------------------------------------------------
# The machine's own Debian mirrors: debian_mirrors, shared with the other root-building script.
# shellcheck source=tools/debian-mirrors.sh
. "$(dirname "${BASH_SOURCE[0]}")/debian-mirrors.sh"

if [ ! -f "$ROOTFS" ] || [ "$(cat "$ROOTFS.recipe" 2>/dev/null)" != "$RECIPE" ]; then
  mapfile -t mirrors < <(debian_mirrors)
  [ ${#mirrors[@]} -gt 0 ] || not_ready "no Debian mirror lines found in /etc/apt/sources.list(.d)"
  log "building the $SUITE root with mmdebstrap from: ${mirrors[*]}"
  # The host's proxy and snapshot settings (mmdebstrap does not read the host's apt.conf).
  aptopts=$CACHE_DIR/apt-host.conf
  apt-config dump 2>/dev/null | grep -E '^Acquire::((https?|ftp)::Proxy|Check-Valid-Until|Check-Date) ' >"$aptopts" || true
  work=$CACHE_DIR/build.$$
  rm -rf "$work" && mkdir -p "$work"
  trap 'rm -rf "$work"' EXIT
  t=$(date +%s%N)
  # /root 0755: the host's Python prefix (pyenv: /root/.pyenv/...) is mounted at the same path inside the
  # pods, and a pod that runs as a non-root user must be able to walk through /root to reach it.
  if TMPDIR=$work timeout 300 mmdebstrap --variant=minbase --format=tar --include="$INCLUDE" \
    --aptopt="$aptopts" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='chmod 0755 "$1/root"' \
    "$SUITE" "$work/rootfs.tar" "${mirrors[@]}" >"$CACHE_DIR/mmdebstrap.log" 2>&1; then
    # Atomically: a half-written tarball never has the final name.
    mv -f "$work/rootfs.tar" "$ROOTFS.tmp.$$" && mv -f "$ROOTFS.tmp.$$" "$ROOTFS" \
      && echo "$RECIPE" >"$ROOTFS.recipe" || not_ready "cannot store $ROOTFS"
  else
    not_ready "mmdebstrap failed (see $CACHE_DIR/mmdebstrap.log): $(tail -n 2 "$CACHE_DIR/mmdebstrap.log")"
  fi
  rm -rf "$work"
  log "built $ROOTFS ($(( $(stat -c %s "$ROOTFS") / 1048576 )) MB) in $(elapsed "$t")"
fi

# --- podman runs a container from it --------------------------------------------------------------------
# The same configuration as tests/e2e/pod_runtime.py: storage in a scratch directory, runc (crun refuses
# this cgroup layout), cgroupfs (PID 1 is not systemd), events in a file, ulimits the VM allows.
check=$CACHE_DIR/check.$$
cleanup_check() {
  if [ -d "$check" ]; then
    CONTAINERS_CONF=$check/containers.conf podman --root "$check/root" --runroot "$check/runroot" \
      rm -fa -t 0 >/dev/null 2>&1
    # Anything podman left mounted under the scratch directory (its overlay home is a private bind mount).
    awk -v d="$check/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
    done
    rm -rf "$check"
  fi
}
trap cleanup_check EXIT
mkdir -p "$check/tmp" "$check/net"
cat >"$check/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$check/tmp"

[network]
network_config_dir = "$check/net"
EOF
pod() { CONTAINERS_CONF=$check/containers.conf timeout 120 podman --root "$check/root" --runroot "$check/runroot" "$@"; }
t=$(date +%s%N)
out=$(pod import --quiet --change "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  "$ROOTFS" localhost/deploykit-check:$SUITE 2>&1) || not_ready "podman import of $ROOTFS failed: $out"
log "podman import in $(elapsed "$t")"
t=$(date +%s%N)
out=$(pod run --rm --network host localhost/deploykit-check:$SUITE \
  sh -c 'python3 -c "print(\"python ok\")" && curl --version >/dev/null && echo curl ok' 2>&1)
case $out in
  *"python ok"*"curl ok"*) log "podman run in $(elapsed "$t"): $(echo "$out" | tr '\n' ' ')" ;;
  *) not_ready "podman run failed: $(echo "$out" | tail -n 3)" ;;
esac
cleanup_check
trap - EXIT

write_status ready "" "recipe=$RECIPE" "rootfs=$ROOTFS" \
  "rootfs_bytes=$(stat -c %s "$ROOTFS")" "podman=$(podman_version)" "runc=$(runc --version | awk 'NR == 1 {print $3}')"
log "ready: $ROOTFS, podman $(podman_version) (total $(elapsed "$START_NS"))"
