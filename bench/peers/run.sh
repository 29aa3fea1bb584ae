#!/usr/bin/env bash
# Runs the side-by-side benchmark of fencekv, etcd and Redis and writes
# bench/RESULTS.md (and bench/RESULTS.json). Called by `make bench-peers`.
#
# Installs etcd-server and redis-server from Debian if they are missing,
# starts each server on a free 127.0.0.1 port with its data in a temp dir,
# runs benchpeers against them, and stops exactly the processes it started,
# by PID. Everything it creates is removed on exit.
#
# Then the 3-node comparison (benchpeers cluster): a fencekv cluster and a
# 3-member etcd cluster, both started by benchpeers on free loopback ports
# (it kills and restarts their leaders for the failover measurement and
# stops every node by PID), whose section is appended to the report.
#
# benchpeers is given each server's PID and measures its CPU time per
# request over every run's measured window.
#
# Environment: FENCEKV (the binary, default bin/fencekv), BENCHPEERS (default
# bin/benchpeers), GO (go), DURATION (5s), WARMUP (1s), ROUNDS (1: how many
# times to run the whole matrix; the report shows medians), CLIENTS
# (1,16,64), WORKLOADS (all), OUT (bench/RESULTS.md), JSON (bench/RESULTS.json),
# SINGLE (1; 0 skips the single-node run and rebuilds its tables from JSON),
# ETCD (1; 0 leaves etcd out of the single-node run: fencekv against Redis
# only, quicker while working on single-node speed),
# CLUSTER (1; 0 skips the 3-node comparison and appends its section from
# CLUSTER_JSON, if there is one), CLUSTER_WORKLOADS
# (fenced-put,lock-cycle,contended,get), KILLS (5 leader kills per system),
# CLUSTER_JSON (bench/RESULTS-cluster.json).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
FENCEKV=${FENCEKV:-$root/bin/fencekv}
BENCHPEERS=${BENCHPEERS:-$root/bin/benchpeers}
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-1s}
ROUNDS=${ROUNDS:-1}
CLIENTS=${CLIENTS:-1,16,64}
WORKLOADS=${WORKLOADS:-all}
OUT=${OUT:-$root/bench/RESULTS.md}
JSON=${JSON:-$root/bench/RESULTS.json}
SINGLE=${SINGLE:-1}
CLUSTER=${CLUSTER:-1}
ETCD=${ETCD:-1}
CLUSTER_WORKLOADS=${CLUSTER_WORKLOADS:-fenced-put,lock-cycle,contended,get}
KILLS=${KILLS:-5}
CLUSTER_JSON=${CLUSTER_JSON:-$root/bench/RESULTS-cluster.json}

say() { echo "bench-peers: $*" >&2; }

for bin in "$FENCEKV" "$BENCHPEERS"; do
	[ -x "$bin" ] || { say "$bin is missing: run 'make build bench-tool' first"; exit 1; }
done

# install_peers installs the Debian packages of the servers that are
# missing, without letting the packages start them as services.
install_peers() {
	local need=()
	command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
	command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
	[ ${#need[@]} -eq 0 ] && return 0
	say "installing ${need[*]} with apt-get"
	local policy=/usr/sbin/policy-rc.d made_policy=
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\n# bench-peers: do not start services while installing\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		made_policy=1
	fi
	local rc=0
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; } >&2 || rc=$?
	[ -n "$made_policy" ] && rm -f "$policy"
	if [ $rc -ne 0 ]; then
		say "apt-get failed (are you root?); install ${need[*]} by hand"
		exit 1
	fi
}
install_peers
etcd_version=$(etcd --version 2>/dev/null | sed -n 's/^etcd Version: //p')

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fencekv-bench.XXXXXX")
pids=()
names=()

cleanup() {
	local i
	for i in "${!pids[@]}"; do
		kill -TERM "${pids[$i]}" 2>/dev/null || true
	done
	for i in "${!pids[@]}"; do
		# Give each 10 s to stop, then kill it; wait reaps our own child.
		local n=0
		while kill -0 "${pids[$i]}" 2>/dev/null && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
		if kill -0 "${pids[$i]}" 2>/dev/null; then
			say "${names[$i]} (pid ${pids[$i]}) did not stop; killing it"
			kill -KILL "${pids[$i]}" 2>/dev/null || true
		fi
		wait "${pids[$i]}" 2>/dev/null || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME CMD...: runs CMD in the background with its output in the
# temp dir, and remembers its PID.
start() {
	local name=$1
	shift
	"$@" >"$tmp/$name.log" 2>&1 &
	last_pid=$!
	pids+=("$last_pid")
	names+=("$name")
	say "started $name (pid $last_pid)"
}

# await NAME PORT: waits up to 30 s for PORT to accept connections, as long
# as the process started last is alive.
await() {
	local name=$1 port=$2 n=0
	until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
		if [ $n -ge 300 ] || ! kill -0 "$last_pid" 2>/dev/null; then
			say "$name did not come up on port $port; its log:"
			tail -20 "$tmp/$name.log" >&2
			exit 1
		fi
		sleep 0.1
		n=$((n + 1))
	done
}

# single_node runs the single-node matrix: one fencekv, one etcd member,
# one Redis, and writes $OUT and $JSON.
single_node() {
	read -r fport eport epeer rport < <("$BENCHPEERS" ports 4)
	mkdir -p "$tmp/fencekv" "$tmp/etcd" "$tmp/redis"

	start fencekv "$FENCEKV" serve --data "$tmp/fencekv" --listen "127.0.0.1:$fport" --http "" --log-level warn
	await fencekv "$fport"
	fpid=$last_pid

	local etcd_args=()
	if [ "$ETCD" = 1 ]; then
		start etcd etcd --name bench --data-dir "$tmp/etcd" \
			--listen-client-urls "http://127.0.0.1:$eport" --advertise-client-urls "http://127.0.0.1:$eport" \
			--listen-peer-urls "http://127.0.0.1:$epeer" --initial-advertise-peer-urls "http://127.0.0.1:$epeer" \
			--initial-cluster "bench=http://127.0.0.1:$epeer" --initial-cluster-state new
		await etcd "$eport"
		etcd_args=(--etcd "http://127.0.0.1:$eport" --etcd-version "$etcd_version" --etcd-pid "$last_pid")
	fi

	start redis redis-server --port "$rport" --bind 127.0.0.1 --dir "$tmp/redis" \
		--appendonly yes --appendfsync always --save "" --daemonize no --logfile ""
	await redis "$rport"
	rpid=$last_pid

	redis_version=$(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')

	say "checking the peer drivers' fencing semantics against these servers"
	(cd "$root/bench/peers" && BENCH_ETCD="$([ "$ETCD" = 1 ] && echo "http://127.0.0.1:$eport")" BENCH_REDIS="127.0.0.1:$rport" \
		"${GO:-go}" test -count=1 ./... >&2)

	say "running benchpeers (this takes a few minutes)"
	"$BENCHPEERS" \
		--fencekv "127.0.0.1:$fport" --fencekv-pid "$fpid" \
		"${etcd_args[@]}" \
		--redis "127.0.0.1:$rport" --redis-version "$redis_version" --redis-pid "$rpid" \
		--data-dir "$tmp" --duration "$DURATION" --warmup "$WARMUP" --rounds "$ROUNDS" \
		--clients "$CLIENTS" --workloads "$WORKLOADS" \
		--out "$OUT" --json "$JSON"
	say "wrote $OUT and $JSON"
}

if [ "$SINGLE" = 1 ]; then
	single_node
else
	say "SINGLE=0: the single-node tables come from $JSON"
	"$BENCHPEERS" --from "$JSON" --out "$OUT"
fi

single_json= # the single-node results, for the cluster's goals against one node
[ -f "$JSON" ] && single_json=$JSON
if [ "$CLUSTER" = 1 ]; then
	say "running the 3-node comparison (benchpeers cluster; it starts and stops both clusters itself)"
	mkdir -p "$tmp/clusters"
	"$BENCHPEERS" cluster --fencekv-bin "$FENCEKV" --etcd-bin "$(command -v etcd)" --etcd-version "$etcd_version" \
		--data-dir "$tmp/clusters" --duration "$DURATION" --warmup "$WARMUP" --rounds "$ROUNDS" \
		--clients "$CLIENTS" --workloads "$CLUSTER_WORKLOADS" --kills "$KILLS" \
		--out "$tmp/cluster.md" --json "$CLUSTER_JSON" ${single_json:+--single "$single_json"}
	{ echo; cat "$tmp/cluster.md"; } >>"$OUT"
	say "appended the 3-node comparison to $OUT; its results are in $CLUSTER_JSON"
elif [ -f "$CLUSTER_JSON" ]; then
	say "CLUSTER=0: the 3-node section comes from $CLUSTER_JSON (not rerun)"
	"$BENCHPEERS" cluster --from "$CLUSTER_JSON" --out "$tmp/cluster.md" ${single_json:+--single "$single_json"}
	{ echo; cat "$tmp/cluster.md"; } >>"$OUT"
fi
