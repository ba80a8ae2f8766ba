#!/usr/bin/env bash
# Installs the Debian packages aenv and its tests need. Idempotent.
set -euo pipefail

packages=(debootstrap iproute2 nftables runc ca-certificates git make)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
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
