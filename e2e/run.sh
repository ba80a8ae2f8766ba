#!/usr/bin/env bash
# End-to-end suite: the official E2B JavaScript SDK (e2b@2.51.0, pinned in
# package-lock.json), and its Code Interpreter SDK (@e2b/code-interpreter),
# against real `aenv server`s with real gVisor sandboxes.
# Needs root and a built bin/ (make build); AENV_BIN_DIR overrides ../bin.
# With a race-enabled aenv there (make test's bin/race), a race the
# detector reports in a server or gateway fails the suite.
#
#   e2e/run.sh                          # the suite
#   AENV_E2E_LIFECYCLE=1 e2e/run.sh     # plus pause/resume, snapshots, fork
#   e2e/run.sh files.test.mjs           # chosen files only
#   AENV_E2E_CLUSTER=1 e2e/run.sh       # against a gateway over three nodes
#
# hosts.test.mjs reaches the server the way a deployment is reached (HTTPS
# on port 443 of names under E2B_DOMAIN): it needs dnsstub beside aenv
# (make test-prepare builds it) and util-linux's unshare.
#
# In cluster mode the suite runs unchanged against `aenv gateway` in front
# of three `aenv node`s, sharing a throwaway PostgreSQL that this script
# starts (Debian's postgresql package) unless AENV_E2E_DATABASE_URL names
# one. With the database it starts, every node and gateway is given one
# secrets key (AENV_SECRETS_KEY_FILE); with AENV_E2E_DATABASE_URL, give
# the database's own key there, if it has one.
#
# AENV_E2E_URL (with AENV_E2E_API_KEY, an admin key) runs the chosen files
# against a deployment the suite did not start, e.g. a compose cluster's
# gateway; only files that need nothing of a server's own (flags, logs,
# data dir) hold there: sandbox, commands and files do, and volumes with
# AENV_E2E_VOLUME_POOL=1 when the deployment's nodes keep volume pools.
#
# AENV_E2E_TRACE=1 logs all SDK traffic to <data dir>/traffic.log and
# AENV_E2E_KEEP=1 keeps the data dirs (server.log) for inspection.
set -euo pipefail

cd "$(dirname "$0")"
export AENV_BIN_DIR="${AENV_BIN_DIR:-$(cd .. && pwd)/bin}"

if [[ $(id -u) != 0 ]]; then
  echo "e2e: needs root (aenv server runs gVisor sandboxes)" >&2
  exit 1
fi
for bin in aenv envd runsc; do
  if [[ ! -x "$AENV_BIN_DIR/$bin" ]]; then
    echo "e2e: $AENV_BIN_DIR/$bin missing (run make build)" >&2
    exit 1
  fi
done

npm ci --no-audit --no-fund --loglevel=error

if [[ -n "${AENV_E2E_URL:-}" && $# -eq 0 ]]; then
  echo "e2e: with AENV_E2E_URL, name the files to run (sandbox.test.mjs commands.test.mjs files.test.mjs hold)" >&2
  exit 2
fi

if [[ $# -gt 0 ]]; then
  files=("$@")
else
  files=(sandbox.test.mjs commands.test.mjs pty.test.mjs files.test.mjs stop.test.mjs templates.test.mjs edges.test.mjs hosts.test.mjs
    teams.test.mjs volumes.test.mjs secrets.test.mjs egress.test.mjs code-interpreter.test.mjs)
  if [[ "${AENV_E2E_LIFECYCLE:-}" == 1 ]]; then
    files+=(lifecycle.test.mjs resume.test.mjs fidelity.test.mjs)
  fi
fi

# start_postgres runs a throwaway PostgreSQL on a unix socket in a temp
# dir (as the postgres user: it refuses root) and exports its URL.
start_postgres() {
  pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  if [[ -z "$pgbin" ]]; then
    echo "e2e: PostgreSQL not installed (run scripts/install-deps.sh)" >&2
    exit 1
  fi
  pgdir=$(mktemp -d /tmp/aenv-e2e-pg.XXXXXX)
  chown postgres: "$pgdir"
  as_postgres() { runuser -u postgres -- "$@"; }
  as_postgres "$pgbin/initdb" -D "$pgdir/data" -U postgres --auth=trust >"$pgdir/initdb.log" 2>&1
  as_postgres "$pgbin/pg_ctl" -D "$pgdir/data" -l "$pgdir/postgres.log" -w -t 120 \
    -o "-c listen_addresses='' -c unix_socket_directories='$pgdir' -c max_connections=300" start >/dev/null
  trap stop_postgres EXIT
  as_postgres "$pgbin/psql" -h "$pgdir" -U postgres -qc 'CREATE DATABASE aenv' postgres
  export AENV_E2E_DATABASE_URL="host=$pgdir user=postgres dbname=aenv sslmode=disable"
}
stop_postgres() {
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$pgdir/data" -m fast -w stop >/dev/null || true
  rm -rf "$pgdir"
}
if [[ "${AENV_E2E_CLUSTER:-}" == 1 && -z "${AENV_E2E_DATABASE_URL:-}" ]]; then
  start_postgres
  # The nodes and the gateway keep the cluster's secrets encrypted with
  # one key (the harness passes the environment on); it goes with the
  # throwaway database.
  if [[ -z "${AENV_SECRETS_KEY_FILE:-}" ]]; then
    (umask 077 && head -c 32 /dev/urandom | base64 >"$pgdir/secrets-key")
    export AENV_SECRETS_KEY_FILE="$pgdir/secrets-key"
  fi
fi

# One file at a time: each starts its own server, and the machine is small.
# node --test exits non-zero when any test fails.
node --test --test-concurrency=1 --test-reporter="${AENV_E2E_REPORTER:-spec}" "${files[@]}"
