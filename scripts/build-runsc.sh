#!/usr/bin/env bash
# Builds the pinned runsc (the gvisor.dev/gvisor version in go.mod) into $1,
# static, with its seccomp filters precompiled in (tools/runsc-seccomp).
#
# The Go toolchain does not let a build replace files of the module cache, so
# the build works on a copy of gVisor's module in a Go workspace beside aenv's:
# the dependency versions are aenv's, as with a plain `go build` from here,
# and the module cache is left untouched.
set -euo pipefail

out=$(realpath -m "$1")
go=${GO:-go}
repo=$(cd "$(dirname "$0")/.." && pwd)
work="$(dirname "$out")/.runsc-build"

# The copy is made read-only by cp (module cache files are); make it
# removable before removing it, also when a step fails.
cleanup() {
	chmod -R u+w "$work" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
cleanup

# Download first: on a fresh machine the module may not be unpacked yet,
# and `go list -m` would then print no directory.
(cd "$repo" && "$go" mod download gvisor.dev/gvisor)
gvisor=$(cd "$repo" && "$go" list -m -f '{{.Dir}}' gvisor.dev/gvisor)
if [[ -z "$gvisor" || ! -d "$gvisor" ]]; then
	echo "build-runsc: gVisor's module is not in the module cache" >&2
	exit 1
fi
mkdir -p "$work"
cp -r "$gvisor" "$work/gvisor"
chmod -R u+w "$work/gvisor"

(cd "$repo" && "$go" run ./tools/runsc-seccomp -gvisor "$work/gvisor")

goversion=$(cd "$repo" && "$go" list -m -f '{{.GoVersion}}')
cat >"$work/go.work" <<WORK
go $goversion

use (
	"$repo"
	./gvisor
)
WORK
(cd "$work" && CGO_ENABLED=0 GOWORK="$work/go.work" "$go" build -o "$out" gvisor.dev/gvisor/runsc)
