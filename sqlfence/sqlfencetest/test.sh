#!/usr/bin/env bash
# The SQL fence against real databases: SQLite always (a pure-Go driver),
# PostgreSQL when a server is installed (Debian: apt-get install postgresql;
# or FENCEKV_PG_BIN=/path/to/bin). The tests start their own server.
set -euo pipefail
cd "$(dirname "$0")"
if [ -z "${FENCEKV_PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
	echo "skipped the PostgreSQL part of the SQL fence suite: no PostgreSQL server; install with apt-get install postgresql"
fi
go vet ./...
go test -race -count=1 -timeout 10m ./...
