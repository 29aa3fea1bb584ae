#!/usr/bin/env bash
# Runs each inventory example (Go, Python, Node, Java: those whose tools are
# here) against a real PostgreSQL and a real fencekv server started here on
# free loopback ports, and checks what they did in the database: a move, a
# move refused for want of stock, a move refused for a stale token (the
# fence raised past the lock's tokens), and every example at once, queueing
# on the lock, with nothing lost. Skips, exit 0, without PostgreSQL.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

pgbin=${FENCEKV_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
if [ -z "$pgbin" ] || [ ! -x "$pgbin/postgres" ] || ! command -v psql >/dev/null 2>&1; then
	echo "skipped inventory examples: PostgreSQL missing; install with apt-get install postgresql"
	exit 0
fi
if [ -z "${FENCEKV_BIN:-}" ] && ! command -v go >/dev/null 2>&1; then
	echo "skipped inventory examples: go missing (to build the server); install with apt-get install golang-go, or set FENCEKV_BIN"
	exit 0
fi

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
# wait_for WHAT SECONDS CMD...: poll CMD every 50ms until it succeeds.
wait_for() {
	local what=$1 secs=$2
	shift 2
	local until=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$until" ] || { echo "timed out waiting for $what" >&2; return 1; }
		sleep 0.05
	done
}
fail() { echo "FAIL: $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# fencekv, on a port it picks and prints.
if [ -z "${FENCEKV_BIN:-}" ]; then
	(cd "$root" && go build -o "$tmp/fencekv" ./cmd/fencekv)
	FENCEKV_BIN=$tmp/fencekv
fi
"$FENCEKV_BIN" serve --data "$tmp/kv" --listen 127.0.0.1:0 --http "" 2>"$tmp/kv.log" &
pids+=($!)
wait_for "fencekv to serve" 20 grep -q 'msg="fencekv serving"' "$tmp/kv.log"
export FENCEKV_ADDR=$(sed -n 's/.*msg="fencekv serving".* addr=\([^ ]*\).*/\1/p' "$tmp/kv.log" | head -1)

# PostgreSQL, as nobody when root (it refuses to run as root).
as=()
if [ "$(id -u)" = 0 ]; then
	as=(setpriv --reuid=65534 --regid=65534 --clear-groups)
	chown 65534:65534 "$tmp"
fi
"${as[@]}" "$pgbin/initdb" -D "$tmp/pg" -U fencekv -A trust -E UTF8 --no-sync >/dev/null
for attempt in 1 2 3 4; do
	pgport=$(free_port)
	"${as[@]}" "$pgbin/postgres" -D "$tmp/pg" -p "$pgport" -k "$tmp" -c listen_addresses=127.0.0.1 -c fsync=off >>"$tmp/pg.log" 2>&1 &
	pgpid=$!
	if wait_for "postgres to accept connections" 60 bash -c "kill -0 $pgpid && psql -qAt -h 127.0.0.1 -p $pgport -U fencekv -d postgres -c 'SELECT 1'"; then
		break
	fi
	kill -0 "$pgpid" 2>/dev/null && { kill "$pgpid"; tail -20 "$tmp/pg.log" >&2; fail "postgres did not start"; }
	[ "$attempt" -lt 4 ] || { tail -20 "$tmp/pg.log" >&2; fail "postgres did not start"; }
done
pids+=("$pgpid")
psql_() { psql -qAtX -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pgport" -U fencekv -d shop "$@"; }
psql -qAtX -h 127.0.0.1 -p "$pgport" -U fencekv -d postgres -c "CREATE DATABASE shop"
export DATABASE_URL="postgres://fencekv@127.0.0.1:$pgport/shop"
export JDBC_URL="jdbc:postgresql://127.0.0.1:$pgport/shop?user=fencekv"
# The schema, as a migration would apply it: the fence, and the table.
psql_ -f "$root/sqlfence/postgres.sql"
psql_ -c "CREATE TABLE inventory (sku text PRIMARY KEY, qty int NOT NULL CHECK (qty >= 0))"
psql_ -c "INSERT INTO inventory VALUES ('apple', 100), ('pear', 100)"

# Each language's command line, where its tools are.
declare -A run
run[go]="$tmp/inventory-go"
(cd "$here/go" && go build -o "$tmp/inventory-go" .)
if python3 -c 'import psycopg' 2>/dev/null; then
	run[python]="env PYTHONPATH=$root/clients/python python3 $here/python/inventory.py"
else
	echo "inventory examples: python skipped: psycopg missing; install with pip install 'psycopg[binary]'"
fi
if command -v node >/dev/null && command -v npm >/dev/null && [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ]; then
	(cd "$root/clients/node" && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; } &&
		{ [ -f dist/src/index.js ] && [ -z "$(find src -newer dist/src/index.js)" ] || npx tsc -p .; })
	(cd "$here/node" && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; })
	run[node]="node $here/node/inventory.mjs"
else
	echo "inventory examples: node skipped: node 20 or later missing; install with apt-get install nodejs npm"
fi
if command -v mvn >/dev/null && command -v javac >/dev/null; then
	(cd "$root/clients/java" && mvn -q -B -Dstyle.color=never dependency:build-classpath -Dmdep.outputFile="$tmp/java.cp" >"$tmp/mvn.log" 2>&1) ||
		{ cat "$tmp/mvn.log" >&2; fail "mvn could not resolve the Java client's class path"; }
	# Compiled once here; `java -cp ... Inventory.java` (README) compiles it at each run.
	javac -d "$tmp/java" -cp "$(cat "$tmp/java.cp")" -sourcepath "$root/clients/java/src/main/java" "$here/java/Inventory.java"
	run[java]="java -XX:TieredStopAtLevel=1 -cp $tmp/java:$(cat "$tmp/java.cp") Inventory"
else
	echo "inventory examples: java skipped: mvn/JDK missing; install with apt-get install maven default-jdk"
fi

qty() { psql_ -c "SELECT qty FROM inventory WHERE sku = '$1'"; }
langs=$(printf '%s\n' "${!run[@]}" | sort)
echo "inventory examples: set up in ${SECONDS}s"
for lang in $langs; do
	t0=$SECONDS apple=$(qty apple) pear=$(qty pear)
	# A move: printed, and in the database.
	out=$(${run[$lang]} apple pear 5) || fail "$lang: the move failed: $out"
	[[ $out =~ ^moved\ 5\ from\ apple\ to\ pear\ under\ token\ [0-9]+:\ apple\ $((apple - 5)),\ pear\ $((pear + 5))$ ]] || fail "$lang printed: $out"
	[ "$(qty apple)" = $((apple - 5)) ] && [ "$(qty pear)" = $((pear + 5)) ] || fail "$lang: the move is not in the database"
	# Not enough apples: refused, rolled back.
	if err=$(${run[$lang]} apple pear 1000 2>&1); then fail "$lang moved 1000 apples: $err"; fi
	[[ $err == *"not that many"* ]] || fail "$lang, not enough: $err"
	# A stale token: the fence is ahead of the lock's tokens; nothing written.
	fence=$(psql_ -c "SELECT token FROM fencekv_fences WHERE resource = 'inventory'")
	psql_ -c "UPDATE fencekv_fences SET token = 9000000000000000000 WHERE resource = 'inventory'"
	if err=$(${run[$lang]} pear apple 1 2>&1); then fail "$lang moved with a stale token: $err"; fi
	[[ $err == *"refused, nothing written"*"9000000000000000000"* ]] || fail "$lang, stale token: $err"
	[ "$(qty apple)" = $((apple - 5)) ] && [ "$(qty pear)" = $((pear + 5)) ] || fail "$lang: a refused move changed the database"
	psql_ -c "UPDATE fencekv_fences SET token = $fence WHERE resource = 'inventory'"
	echo "inventory examples: $lang ok in $((SECONDS - t0))s: $out"
done

# Every example at once: they queue on the lock; each move lands once,
# under its own token, and nothing is lost.
t0=$SECONDS pear=$(qty pear)
jobs_=()
for lang in $langs; do
	${run[$lang]} pear apple 2 >>"$tmp/all.out" 2>&1 &
	jobs_+=($!)
done
for j in "${jobs_[@]}"; do wait "$j" || { cat "$tmp/all.out" >&2; fail "a concurrent move failed"; }; done
moves=$(echo "$langs" | wc -w)
[ "$(grep -c '^moved 2 from pear to apple under token' "$tmp/all.out")" = "$moves" ] || { cat "$tmp/all.out" >&2; fail "not every concurrent move printed"; }
[ "$(sed -n 's/.*under token \([0-9]*\):.*/\1/p' "$tmp/all.out" | sort -u | wc -l)" = "$moves" ] || fail "two moves shared a token"
[ "$(qty pear)" = $((pear - 2 * moves)) ] || fail "pear is $(qty pear), want $((pear - 2 * moves))"
[ "$(psql_ -c "SELECT sum(qty) FROM inventory")" = 200 ] || fail "units were lost or made"
echo "inventory examples: ok ($(echo $langs); $moves concurrent moves in $((SECONDS - t0))s; ${SECONDS}s in all)"
