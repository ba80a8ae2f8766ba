#!/bin/sh
# Regenerates the Go code for the envd protos. Run from anywhere; needs protoc
# on PATH and the protoc-gen-go / protoc-gen-connect-go tools pinned in go.mod.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
module_root=$(cd "$here/../.." && pwd)
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT

cd "$module_root"
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-connect-go" connectrpc.com/connect/cmd/protoc-gen-connect-go

cd "$here"
for svc in process filesystem; do
	protoc \
		--plugin=protoc-gen-go="$bin/protoc-gen-go" \
		--plugin=protoc-gen-connect-go="$bin/protoc-gen-connect-go" \
		-I . \
		--go_out=. --go_opt=paths=source_relative \
		--connect-go_out=. --connect-go_opt=paths=source_relative \
		"$svc/$svc.proto"
done
