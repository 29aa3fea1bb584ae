#!/usr/bin/env bash
# The Java client's tests (JUnit 5, clients/CONFORMANCE.md) against a real
# fencekv serve built from this tree (or $FENCEKV_BIN).
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v mvn >/dev/null 2>&1 || ! command -v java >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then
	echo "skipped java client: mvn/JDK missing; install with apt-get install maven default-jdk"
	exit 0
fi
if [ -z "${FENCEKV_BIN:-}" ]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	(cd ../.. && go build -o "$tmp/fencekv" ./cmd/fencekv)
	export FENCEKV_BIN="$tmp/fencekv"
fi
exec mvn -q -B test
