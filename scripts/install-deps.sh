#!/usr/bin/env bash
# Installs the Debian packages aenv and its tests need. Idempotent.
# With --runtime, only those a machine that runs aenv needs (what
# scripts/install.sh installs); without, those of development and the tests too.
set -euo pipefail

# What aenv itself runs: debootstrap builds the base template (a Debian
# bookworm, whose signatures debian-archive-keyring checks on an Ubuntu host
# too); ca-certificates lets image pulls and the object store speak HTTPS;
# btrfs-progs' mkfs.btrfs makes the volume pool (--volume-pool-gb);
# erofs-utils' mkfs.erofs makes the root file system images of --root-image.
runtime=(debootstrap debian-archive-keyring ca-certificates btrfs-progs erofs-utils)
# iproute2/nftables/procps are used by the tests to inspect what the server
# made; runc is the benchmarks' baseline; postgresql gives the PostgreSQL
# store's tests their throwaway servers; gcc and libc6-dev are cgo's, which
# the race detector needs (go test -race and the race-enabled server the tests
# run); util-linux's unshare and mount give the SDK suite's https test a
# resolv.conf of its own; systemd's systemd-analyze verifies the units in
# deploy/systemd; chromium is the headless browser the web console's tests
# drive (test/integration/console_test.go); openssl makes the certificates of
# the SDK suite's fake HTTPS hosts (e2e/harness.mjs); python3-ipython and
# python3-matplotlib run the code interpreter's kernel.py in its Go tests
# (internal/codeinterp: cells, figures and their charts); podman runs the
# gateway's container image (test/integration/images_test.go) and
# deploy/compose's cluster, whose published ports take CNI's bridge and
# iptables (test/integration/compose_test.go).
development=(iproute2 nftables procps runc git make postgresql gcc libc6-dev util-linux mount systemd systemd-container python3-ipython python3-matplotlib chromium openssl podman containernetworking-plugins iptables)

packages=("${runtime[@]}")
case "${1:-}" in
--runtime) ;;
"") packages+=("${development[@]}") ;;
*)
	echo "usage: $0 [--runtime]" >&2
	exit 2
	;;
esac
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The Python client's tests and the E2B SDK suite need python3 and node/npm;
# machines that already have them (from elsewhere than apt) keep theirs.
if [ "${1:-}" != --runtime ]; then
	command -v python3 >/dev/null || missing+=(python3)
	command -v node >/dev/null || missing+=(nodejs)
	command -v npm >/dev/null || missing+=(npm)
fi
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
