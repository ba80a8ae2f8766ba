#!/usr/bin/env bash
# Runs the Python SDK's tests: unit tests against a local test peer, then
# the integration tests (and the GRPO example) against a real aenv server
# this script starts and stops. Needs root (the server runs sandboxes).
#
#   sdk/python/run-tests.sh                    # unit + integration
#   AENV_LIFECYCLE=1 sdk/python/run-tests.sh   # + pause/resume/fork/snapshots
#
# Env: AENV_BIN (default <repo>/bin/aenv), AENV_TEMPLATE_CACHE_DIR (default
# /var/cache/aenv-test, shared so the base template is built only once).
# A race-enabled AENV_BIN (make test's) writes its race reports to files
# that fail the run.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
aenv_bin="${AENV_BIN:-$repo/bin/aenv}"
cache_dir="${AENV_TEMPLATE_CACHE_DIR:-/var/cache/aenv-test}"

if [[ $EUID -ne 0 ]]; then
  echo "run-tests.sh: the aenv server needs root" >&2
  exit 1
fi
if [[ ! -x "$aenv_bin" ]]; then
  echo "run-tests.sh: no aenv binary at $aenv_bin (make build, or set AENV_BIN)" >&2
  exit 1
fi

data_dir="$(mktemp -d /tmp/aenv-pytest.XXXXXX)"
log="$data_dir/server.log"
# Outside the data dir, which stop_server removes before the check.
race_dir="$(mktemp -d /tmp/aenv-pytest-race.XXXXXX)"
server_pid=""

stop_server() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"
    for _ in $(seq 1 60); do
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$server_pid" 2>/dev/null; then
      echo "run-tests.sh: server did not stop on SIGTERM; killing it" >&2
      kill -KILL "$server_pid" || true
    fi
    wait "$server_pid" 2>/dev/null || true
  fi
  # A stopped server (started with --kill-on-exit) must leave no mount in
  # its data dir; one that does is a leak: report it, fail, and clean up.
  leaks="$(awk -v d="$data_dir/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r)"
  if [[ -n "$leaks" ]]; then
    echo "run-tests.sh: LEAK: the server left mounts behind:" >&2
    echo "$leaks" >&2
    echo "$leaks" | while read -r m; do umount "$m" || umount -l "$m" || true; done
    leaked=1
  fi
  rm -rf "$data_dir" || echo "run-tests.sh: could not remove $data_dir" >&2
  # A race-enabled server writes a file per process that raced (race.<pid>).
  for f in "$race_dir"/race.*; do
    if [[ -s "$f" ]]; then
      echo "run-tests.sh: RACE: the race detector reported ($f):" >&2
      cat "$f" >&2
      raced=1
    fi
  done
  rm -rf "$race_dir"
}
leaked=0
raced=0
on_exit() {
  local status=$?
  stop_server
  if [[ ($leaked == 1 || $raced == 1) && $status == 0 ]]; then
    exit 1
  fi
  exit "$status"
}
trap on_exit EXIT

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
suffix="$(tr -dc 'a-z' </dev/urandom | head -c 4 || true)"
api_key="pytest-$(tr -dc 'a-z0-9' </dev/urandom | head -c 16 || true)"
cidr="10.$((RANDOM % 150 + 100)).$((RANDOM % 250)).0/24"

mkdir -p "$cache_dir"
GORACE="log_path=$race_dir/race halt_on_error=0" "$aenv_bin" server --data-dir "$data_dir" --listen "127.0.0.1:$port" --api-key "$api_key" \
  --template-cache-dir "$cache_dir" --net-prefix "py$suffix" --sandbox-cidr "$cidr" \
  --kill-on-exit >"$log" 2>&1 &
server_pid=$!

url="http://127.0.0.1:$port"
echo "run-tests.sh: waiting for aenv server at $url (log $log)"
for _ in $(seq 1 600); do  # up to 10 minutes: the first start builds the base template
  if python3 -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1] + '/health', timeout=1)" "$url" 2>/dev/null; then
    break
  fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "run-tests.sh: server exited during start:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 1
done

export AENV_URL="$url" AENV_API_KEY="$api_key" AENV_REQUIRE_ROOT_TESTS=1
status=0
python3 -m unittest discover -s "$here/tests" -v || status=$?
if [[ $status -ne 0 ]]; then
  echo "run-tests.sh: tests failed; last server log lines:" >&2
  tail -n 40 "$log" >&2
fi
exit $status
