#!/usr/bin/env bash
# Regenerates every proto/*.proto into a scratch tree and fails if the committed Go differs.
# Needs protoc (Debian: protobuf-compiler) and protoc-gen-go v1.36.12 on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
protoc --go_out="$tmp" --go_opt=module=github.com/atoll-run/atoll proto/*.proto
status=0
for f in $(cd "$tmp" && find . -name '*.pb.go'); do
  if ! diff -q "$tmp/$f" "$f" >/dev/null 2>&1; then
    echo "proto: $f is out of date with its .proto (regenerate: protoc --go_out=. --go_opt=module=github.com/atoll-run/atoll proto/*.proto)"
    status=1
  fi
done
exit $status
