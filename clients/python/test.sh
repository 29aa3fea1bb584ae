#!/usr/bin/env bash
# The Python client's suite (clients/CONFORMANCE.md C01-C14, and fencekv.aio)
# against real `fencekv serve` processes built from this tree ($FENCEKV_BIN
# if set).
set -euo pipefail
cd "$(dirname "$0")"
if ! python3 -c 'import msgpack, pytest' 2>/dev/null; then
	echo "skipped python client: msgpack/pytest missing; install with pip install msgpack pytest"
	exit 0
fi
if [ -z "${FENCEKV_BIN:-}" ]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	(cd ../.. && go build -o "$tmp/fencekv" ./cmd/fencekv)
	export FENCEKV_BIN="$tmp/fencekv"
fi
exec python3 -m pytest -q -p no:cacheprovider tests
