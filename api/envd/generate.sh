#!/bin/sh
# Regenerates the Go code for the envd protos. Run from anywhere; needs
# protoc on PATH. The protoc plugins are the tools pinned in go.mod.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
protoc_gen_go=$(go tool -n protoc-gen-go)
protoc_gen_connect_go=$(go tool -n protoc-gen-connect-go)

cd "$here"
for svc in process filesystem; do
	protoc \
		--plugin=protoc-gen-go="$protoc_gen_go" \
		--plugin=protoc-gen-connect-go="$protoc_gen_connect_go" \
		-I . \
		--go_out=. --go_opt=paths=source_relative \
		--connect-go_out=. --connect-go_opt=paths=source_relative \
		"$svc/$svc.proto"
done
