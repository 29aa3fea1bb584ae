#!/usr/bin/env bash
# Per-call benchmark of the Java client beside Jedis (src/test/java/io/fencekv/Bench.java):
#   ./bench.sh [seconds per case, default 1] [rounds, default 3]
# BENCH_OPS="get,put (durable),fenced put,acquire+release" and BENCH_CALLERS=1,16 select cases.
# Not part of test.sh. Builds the server from the tree (or uses $FENCEKV_BIN);
# compares with redis-server ($REDIS_SERVER, /usr/bin/redis-server or PATH) if present.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v mvn >/dev/null 2>&1 || ! command -v java >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then
	echo "skipped java bench: mvn/JDK missing; install with apt-get install maven default-jdk"
	exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "${FENCEKV_BIN:-}" ]; then
	(cd ../.. && go build -o "$tmp/fencekv" ./cmd/fencekv)
	export FENCEKV_BIN="$tmp/fencekv"
fi
mvn -q -B test-compile dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile="$tmp/cp.txt"
exec java -cp "target/classes:target/test-classes:$(cat "$tmp/cp.txt")" io.fencekv.Bench "$@"
