#!/usr/bin/env bash
# Installs aenv as a systemd service: aenv, envd and the pinned runsc (from
# bin/, as `make build` leaves them) under a prefix, the Debian packages aenv
# needs, /etc/aenv/aenv.env (kept if present) and the units aenv.service,
# aenv-node.service and aenv-gateway.service. See docs/install.md.
#
# Every check comes before the first change: a system this cannot install on
# is refused with nothing touched.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)

usage() {
	cat <<EOF
usage: $0 [options]
  --prefix DIR     install the binaries in DIR/bin (default: \$PREFIX, else /usr/local)
  --destdir DIR    stage everything under DIR, for a package or an image (default: \$DESTDIR);
                   installs no packages, runs no systemctl, and does not need root
  --bin-dir DIR    take aenv, envd and runsc from DIR (default: $repo/bin; make build)
  --unit-dir DIR   where the systemd units go (default: /etc/systemd/system)
  --no-deps        do not install the Debian packages (scripts/install-deps.sh --runtime)
  --uninstall      stop and remove the units and the binaries; keep /etc/aenv and the data
  --purge          with --uninstall: remove /etc/aenv and the data (/var/lib/aenv) too
EOF
}

prefix=${PREFIX:-/usr/local}
destdir=${DESTDIR:-}
bin_dir=$repo/bin
unit_dir=/etc/systemd/system
deps=1
uninstall=0
purge=0
while [ $# -gt 0 ]; do
	case "$1" in
	--prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
	--destdir) destdir=${2:?--destdir needs a directory}; shift 2 ;;
	--bin-dir) bin_dir=${2:?--bin-dir needs a directory}; shift 2 ;;
	--unit-dir) unit_dir=${2:?--unit-dir needs a directory}; shift 2 ;;
	--no-deps) deps=0; shift ;;
	--uninstall) uninstall=1; shift ;;
	--purge) purge=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "install: unknown argument $1" >&2; usage >&2; exit 2 ;;
	esac
done

binaries=(aenv envd runsc)
units=(aenv.service aenv-node.service aenv-gateway.service)
conf_dir=/etc/aenv
gateway_state=(/var/lib/aenv-gateway /var/lib/private/aenv-gateway)

fail() {
	echo "install: $*" >&2
	echo "install: nothing was changed" >&2
	exit 1
}

# The probes of the system. The AENV_INSTALL_* variables stand in for them
# in the tests (deploy/systemd/units_test.go), which check refusals.
os_release=${AENV_INSTALL_OS_RELEASE:-/etc/os-release}
arch=${AENV_INSTALL_ARCH:-$(uname -m)}
systemctl=${AENV_INSTALL_SYSTEMCTL-$(command -v systemctl || true)}

# --- checks: nothing below changes the system until they all pass ---------

if [ "$purge" = 1 ] && [ "$uninstall" = 0 ]; then
	echo "install: --purge goes with --uninstall" >&2
	exit 2
fi
case "$prefix" in
/*) ;;
*) fail "--prefix must be an absolute path, got '$prefix'" ;;
esac
case "$arch" in
x86_64 | amd64 | aarch64 | arm64) ;;
*) fail "unsupported architecture $arch: aenv runs on amd64 (x86_64) and arm64 (aarch64), as gVisor does" ;;
esac
os_id=
if [ -r "$os_release" ]; then
	# shellcheck disable=SC1090 # os-release is shell assignments by definition
	os_id=$(. "$os_release" && echo "${ID:-} ${ID_LIKE:-}")
fi
case " $os_id " in
*" debian "* | *" ubuntu "*) ;;
*) fail "unsupported system '${os_id# }' (from $os_release): this script installs on Debian or Ubuntu (apt and systemd); elsewhere build with make build and see docs/install.md" ;;
esac
if [ -z "$systemctl" ] || [ ! -x "$systemctl" ]; then
	fail "systemd is not installed here (no systemctl): the units need it; run aenv server by hand instead (docs/install.md)"
fi
if [ -z "$destdir" ] && [ "$(id -u)" != 0 ]; then
	fail "run as root (it installs packages, binaries in $prefix/bin and systemd units), or stage with --destdir"
fi
if [ "$uninstall" = 0 ]; then
	for b in "${binaries[@]}"; do
		[ -x "$bin_dir/$b" ] || fail "$bin_dir/$b is missing: run make build first (or give --bin-dir)"
	done
	for u in "${units[@]}"; do
		[ -r "$repo/deploy/systemd/$u" ] || fail "$repo/deploy/systemd/$u is missing"
	done
fi
# systemctl only talks to a running systemd: not in a chroot, an image build
# or a staged --destdir, where the units are only laid down.
live=0
if [ -z "$destdir" ] && [ -d /run/systemd/system ]; then
	live=1
fi

data_dirs=(/var/lib/aenv)
if [ "$purge" = 1 ]; then
	# The data dirs the units were given: any of their environment files
	# may move it (aenv.env for all, server.env and node.env for one).
	for f in aenv.env server.env node.env; do
		[ -r "$destdir$conf_dir/$f" ] || continue
		d=$(sed -n 's/^[[:space:]]*AENV_DATA_DIR=["'\'']\{0,1\}\([^"'\'']*\)["'\'']\{0,1\}[[:space:]]*$/\1/p' "$destdir$conf_dir/$f" | tail -n 1)
		[ -n "$d" ] && [[ " ${data_dirs[*]} " != *" $d "* ]] && data_dirs+=("$d")
	done
	for d in "${data_dirs[@]}"; do
		case "$d" in
		/?*) ;;
		*) fail "refusing to purge the data dir '$d': not an absolute path" ;;
		esac
		# Sandboxes left running hold mounts in the data dir; removing files
		# under them would reach into the sandboxes.
		if [ -d "$destdir$d" ] && awk -v d="$(realpath -m "$destdir$d")" \
			'$5 == d || index($5, d "/") == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
			fail "sandboxes still hold mounts in $destdir$d: kill them first (aenv ls; aenv kill ID..., or AENV_KILL_ON_EXIT=true and stop the service)"
		fi
		# Only a directory aenv made: a data dir set to /srv must not take
		# /srv with it. aenv keeps its lock file in every data dir it ran on.
		if [ -d "$destdir$d" ] && [ -n "$(ls -A "$destdir$d")" ] && [ ! -e "$destdir$d/lock" ] && [ ! -e "$destdir$d/aenv.db" ]; then
			fail "refusing to purge $destdir$d: it holds no aenv lock file nor database, so it may not be aenv's alone; remove what you want by hand"
		fi
	done
fi

# --- changes ---------------------------------------------------------------

if [ "$uninstall" = 1 ]; then
	for u in "${units[@]}"; do
		if [ "$live" = 1 ] && [ -e "$unit_dir/$u" ]; then
			# Stops the server only: its sandboxes keep running (KillMode=process).
			"$systemctl" disable --now "$u" >/dev/null 2>&1 || true
		fi
		rm -f "$destdir$unit_dir/$u"
	done
	[ "$live" = 1 ] && "$systemctl" daemon-reload
	for b in "${binaries[@]}"; do
		rm -f "$destdir$prefix/bin/$b"
	done
	if [ "$purge" = 1 ]; then
		rm -rf "$destdir$conf_dir"
		# --one-file-system: never across a mount, should one appear now.
		for d in "${data_dirs[@]}"; do
			rm -rf --one-file-system "$destdir$d"
		done
		for d in "${gateway_state[@]}"; do
			rm -rf --one-file-system "$destdir$d"
		done
		echo "install: removed aenv, its units, $conf_dir and ${data_dirs[*]}"
	else
		echo "install: removed aenv and its units; kept $conf_dir and the data (--purge removes them)"
	fi
	exit 0
fi

if [ "$deps" = 1 ] && [ -z "$destdir" ]; then
	"$repo/scripts/install-deps.sh" --runtime
fi

install -d -m 0755 "$destdir$prefix/bin"
for b in "${binaries[@]}"; do
	# install unlinks the old file first: a running aenv keeps its binary.
	install -m 0755 "$bin_dir/$b" "$destdir$prefix/bin/$b"
done

install -d -m 0755 "$destdir$unit_dir"
for u in "${units[@]}"; do
	tmp=$(mktemp "$destdir$unit_dir/.$u.XXXXXX")
	sed "s#@BINDIR@#$prefix/bin#g" "$repo/deploy/systemd/$u" >"$tmp"
	chmod 0644 "$tmp"
	mv -f "$tmp" "$destdir$unit_dir/$u"
done

install -d -m 0755 "$destdir$conf_dir"
if [ -e "$destdir$conf_dir/aenv.env" ]; then
	echo "install: kept $conf_dir/aenv.env"
else
	install -m 0600 "$repo/deploy/systemd/aenv.env" "$destdir$conf_dir/aenv.env"
fi

if [ "$live" = 1 ]; then
	"$systemctl" daemon-reload
fi
echo "install: installed aenv, envd and runsc in $destdir$prefix/bin and ${units[*]} in $destdir$unit_dir"
if [ -z "$destdir" ]; then
	echo "install: start a single node with: systemctl enable --now aenv; logs: journalctl -u aenv"
	echo "install: an upgrade takes effect at: systemctl restart aenv (its sandboxes are kept)"
fi
