#!/usr/bin/env bash
# End-to-end suite: the official E2B JavaScript SDK (e2b@2.51.0, pinned in
# package-lock.json) against real `aenv server`s with real gVisor sandboxes.
# Needs root and a built bin/ (make build); AENV_BIN_DIR overrides ../bin.
#
#   e2e/run.sh                          # the suite
#   AENV_E2E_LIFECYCLE=1 e2e/run.sh     # plus pause/resume, snapshots, fork
#   e2e/run.sh files.test.mjs           # chosen files only
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

if [[ $# -gt 0 ]]; then
  files=("$@")
else
  files=(sandbox.test.mjs commands.test.mjs pty.test.mjs files.test.mjs stop.test.mjs templates.test.mjs)
  if [[ "${AENV_E2E_LIFECYCLE:-}" == 1 ]]; then
    files+=(lifecycle.test.mjs resume.test.mjs fidelity.test.mjs)
  fi
fi

# One file at a time: each starts its own server, and the machine is small.
# node --test exits non-zero when any test fails.
exec node --test --test-concurrency=1 --test-reporter="${AENV_E2E_REPORTER:-spec}" "${files[@]}"
