#!/usr/bin/env bash
# Services the test suite needs, started before `make test` (.ci/run calls this as root).
#
# PostgreSQL: Debian's package, one cluster listening on 127.0.0.1, a role and a database for the
# results-store tests. The tests connect to
#   postgresql+psycopg://deploykit:deploykit@127.0.0.1:5432/deploykit_test
# (override with DEPLOYKIT_TEST_PG_URL). Idempotent: when everything is there already it only checks
# that the server answers (well under a second).
set -euo pipefail

PG_ROLE=deploykit
PG_PASSWORD=deploykit
PG_DB=deploykit_test
PG_PORT=${DEPLOYKIT_TEST_PG_PORT:-5432}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

as_postgres() {
  as_root runuser -u postgres -- "$@"
}

# systemd-analyze (Debian's systemd package) checks the rendered units in tests/render.
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "ci-services: installing systemd-analyze (Debian package systemd)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
fi

# Prometheus (Debian's package, 2.42): promtool checks and unit-tests the canary's alert rules
# (tests/render/test_alerts.py); the alerts e2e starts a prometheus of its own, with its own config and
# storage (tests/e2e/test_alerts_e2e.py). The packaged service is not wanted: while the package installs, a
# policy-rc.d (unless one is in place already) keeps its postinst from starting it, and the service is then
# disabled, so no prometheus runs now or after a boot. No recommends: they would bring node-exporter's service.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  echo "ci-services: installing Prometheus (Debian package; its service left stopped and disabled)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  POLICY_RC=/usr/sbin/policy-rc.d
  placed_policy=
  if [ ! -e "$POLICY_RC" ]; then
    printf '#!/bin/sh\n# ci-services.sh: no service starts while prometheus installs\nexit 101\n' |
      as_root tee "$POLICY_RC" >/dev/null
    as_root chmod 0755 "$POLICY_RC"
    placed_policy=1
  fi
  installed=0
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
    >/dev/null || installed=$?
  if [ -n "$placed_policy" ]; then as_root rm -f "$POLICY_RC"; fi
  [ "$installed" -eq 0 ] || exit "$installed"
  if command -v systemctl >/dev/null 2>&1; then
    # Stops it where systemd runs (it never started: policy-rc.d); elsewhere only removes the boot link.
    as_root systemctl disable --now prometheus.service >/dev/null 2>&1 ||
      as_root systemctl disable prometheus.service >/dev/null 2>&1 || true
  fi
fi
promtool --version >/dev/null

# The Argo Rollouts schemas, test-only: tests/render/test_gate_render.py validates the chart's AnalysisTemplate
# with the validators of npm's @kubernetes-models/argo-rollouts (compiled from Argo Rollouts' own Go types, its
# Job provider's JobSpec included) and reads the property names its type declarations list. Pinned, with the
# four @kubernetes-models packages it needs, into a cache folder of their own (no package.json of ours, no
# lifecycle script run); Node.js is the machine's, else Debian's.
ARGO_MODELS_DIR=${DEPLOYKIT_ARGO_MODELS_DIR:-/var/cache/deploykit-ci/npm}
ARGO_MODELS=(
  @kubernetes-models/argo-rollouts@2.0.0 @kubernetes-models/base@6.0.1 @kubernetes-models/apimachinery@3.0.2
  @kubernetes-models/validate@5.0.2 kubernetes-models@5.1.0
)
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "ci-services: installing Node.js and npm (Debian packages)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
if ! grep -qs '"version": "2.0.0"' "$ARGO_MODELS_DIR/node_modules/@kubernetes-models/argo-rollouts/package.json"; then
  echo "ci-services: installing ${ARGO_MODELS[0]} (npm) into $ARGO_MODELS_DIR"
  as_root mkdir -p "$ARGO_MODELS_DIR"
  as_root npm install --prefix "$ARGO_MODELS_DIR" --no-save --no-package-lock --no-audit --no-fund \
    --ignore-scripts --loglevel=error "${ARGO_MODELS[@]}" >/dev/null
fi

if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  echo "ci-services: installing PostgreSQL (Debian package)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

PG_VERSION=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
if ! pg_lsclusters -h | awk -v v="$PG_VERSION" '$1 == v && $2 == "main" {found = 1} END {exit !found}'; then
  echo "ci-services: creating cluster $PG_VERSION/main on port $PG_PORT"
  as_root pg_createcluster --port "$PG_PORT" "$PG_VERSION" main >/dev/null
fi
# The cluster's own port wins: an existing cluster keeps whatever it was created with.
PG_PORT=$(pg_lsclusters -h | awk -v v="$PG_VERSION" '$1 == v && $2 == "main" {print $3}')

if ! pg_lsclusters -h | awk -v v="$PG_VERSION" '$1 == v && $2 == "main" && $4 == "online" {found = 1} END {exit !found}'; then
  echo "ci-services: starting PostgreSQL $PG_VERSION/main"
  as_root install -d -o postgres -g postgres -m 2775 /var/run/postgresql
  as_root pg_ctlcluster "$PG_VERSION" main start
fi

for _ in $(seq 1 60); do
  if pg_isready -q -h 127.0.0.1 -p "$PG_PORT"; then break; fi
  sleep 0.5
done
pg_isready -h 127.0.0.1 -p "$PG_PORT" >/dev/null || {
  echo "ci-services: PostgreSQL does not answer on 127.0.0.1:$PG_PORT" >&2
  exit 1
}

as_postgres psql -q -p "$PG_PORT" -v ON_ERROR_STOP=1 -d postgres <<SQL
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_ROLE') THEN
    CREATE ROLE $PG_ROLE LOGIN PASSWORD '$PG_PASSWORD';
  END IF;
END
\$\$;
SQL
if ! as_postgres psql -p "$PG_PORT" -tAc "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" -d postgres | grep -q 1; then
  as_postgres createdb -p "$PG_PORT" -O "$PG_ROLE" "$PG_DB"
fi

echo "ci-services: PostgreSQL ready: postgresql+psycopg://$PG_ROLE:***@127.0.0.1:$PG_PORT/$PG_DB"

# podman and a cached Debian root for the tests that play pods (tests/e2e/pod_runtime.py). It never fails
# this script: on a machine that cannot run containers it says why, and those tests skip with that reason.
bash "$(dirname "$0")/pod-runtime.sh" || echo "ci-services: tools/pod-runtime.sh exited $?; the pod tests will skip"

# A cached Debian root with systemd, booted by systemd-nspawn in the tests that install the rendered units
# under a real systemd (tests/e2e/nspawn_runtime.py). Never fails this script: on a machine where nspawn
# cannot run it says why, and those tests skip with that reason.
bash "$(dirname "$0")/nspawn-root.sh" || echo "ci-services: tools/nspawn-root.sh exited $?; the systemd unit tests will skip"

# The Python sources of every supported vLLM release without a CPU build (0.33: its PyPI wheel, ~336 MB,
# sha256-pinned, cached under /var/cache/deploykit-ci/vllm-sources) for the tier tests/vllm_releases,
# which fetches them itself when this could not (and fails under CI=true when it cannot either).
bash "$(dirname "$0")/fetch-vllm-sources.sh" >/dev/null || echo "ci-services: tools/fetch-vllm-sources.sh exited $?"
