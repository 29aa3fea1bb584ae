#!/usr/bin/env bash
# The Python client's suite (clients/CONFORMANCE.md C01-C15, and fencekv.aio)
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
# fencekv.sqlfence's PostgreSQL tests start their own server; without one
# (or without psycopg) they are skipped, the SQLite ones still run.
if ! python3 -c 'import psycopg' 2>/dev/null || { [ -z "${FENCEKV_PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; }; then
	echo "skipped the PostgreSQL part of fencekv.sqlfence: psycopg or a PostgreSQL server missing; install with pip install 'psycopg[binary]' and apt-get install postgresql"
fi
exec python3 -m pytest -q -p no:cacheprovider tests
