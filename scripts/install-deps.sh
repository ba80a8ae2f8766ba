#!/usr/bin/env bash
# Installs the Debian packages aenv and its tests need. Idempotent.
set -euo pipefail

# debootstrap builds the base template; iproute2/nftables/procps are used by
# the tests to inspect what the server made; runc is the benchmarks' baseline;
# postgresql gives the PostgreSQL store's tests their throwaway servers;
# gcc and libc6-dev are cgo's, which the race detector needs (go test -race
# and the race-enabled server the tests run); util-linux's unshare and mount
# give the SDK suite's https test a resolv.conf of its own.
packages=(debootstrap iproute2 nftables procps runc ca-certificates git make postgresql gcc libc6-dev util-linux mount)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The Python client's tests and the E2B SDK suite need python3 and node/npm;
# machines that already have them (from elsewhere than apt) keep theirs.
command -v python3 >/dev/null || missing+=(python3)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "install-deps: need root to install: ${missing[*]}" >&2
		exit 1
	fi
	echo "install-deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
