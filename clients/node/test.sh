#!/usr/bin/env bash
# The Node client's tests: conformance scenarios C01-C15
# (clients/CONFORMANCE.md) against real fencekv servers built from this tree
# (or $FENCEKV_BIN). Skips, exit 0, when node or npm is missing.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	echo "skipped node client: node missing; install with apt-get install nodejs npm"
	exit 0
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
	echo "skipped node client: node $(node --version) is older than 20; install with apt-get install nodejs npm (Node 20 or later)"
	exit 0
fi
if [ -z "${FENCEKV_BIN:-}" ] && ! command -v go >/dev/null 2>&1; then
	echo "skipped node client: go missing (to build the server); install with apt-get install golang-go, or set FENCEKV_BIN"
	exit 0
fi
[ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error
npx tsc -p .
if [ -z "${FENCEKV_BIN:-}" ]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	(cd ../.. && go build -o "$tmp/fencekv" ./cmd/fencekv)
	export FENCEKV_BIN="$tmp/fencekv"
fi
# One file at a time: the timing scenarios (C07) and the cluster want the
# machine's cores to themselves.
exec node --test --test-concurrency=1 --test-timeout=120000 dist/test/*.test.js
