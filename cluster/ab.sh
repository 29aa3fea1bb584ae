#!/usr/bin/env bash
# cluster/ab.sh ROUNDS BIN... : measure fencekv binaries against each other
# on 3-node clusters, interleaved. Starts one cluster per binary (free
# loopback ports, temp dirs, --http ""), all up at once, then for each round
# runs each workload/clients pair on every cluster back to back (fencekv
# bench, clients spread over the nodes), so that the load of a shared
# machine drifts over all of them alike; stops what it started by PID.
# Prints "variant workload clients ops/s p50_us errors", variant being the
# name of the binary's directory: build each into a directory of its own,
#   go build -o /tmp/ab/base/fencekv ./cmd/fencekv
# RUNS="fenced-put:64 lock-cycle:64 ..." and DUR=2s tune it. Compare the
# per-run ratios to the first binary (each line's neighbours), not absolute
# numbers: on this 2-core machine a run's throughput drifts 2-3x over minutes.
set -uo pipefail
rounds=$1; shift
dur=${DUR:-2s}
freeport() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
declare -A addrs
allpids=()
dirs=()
for bin in "$@"; do
	d=$(mktemp -d ${TMPDIR:-/tmp}/fencekv-ab.XXXX); dirs+=($d)
	cp=(); rp=(); gp=()
	for i in 0 1 2; do cp+=($(freeport)); rp+=($(freeport)); gp+=($(freeport)); done
	join="127.0.0.1:${gp[0]},127.0.0.1:${gp[1]},127.0.0.1:${gp[2]}"
	for i in 0 1 2; do
		"$bin" serve --node n$i --data $d/n$i --listen 127.0.0.1:${cp[$i]} --raft 127.0.0.1:${rp[$i]} --gossip 127.0.0.1:${gp[$i]} --http "" \
			--bootstrap-expect 3 --join "$join" >$d/n$i.log 2>&1 &
		allpids+=($!)
	done
	addrs[$bin]="127.0.0.1:${cp[0]},127.0.0.1:${cp[1]},127.0.0.1:${cp[2]}"
	ok=0
	for t in $(seq 300); do
		if "$bin" put --addr 127.0.0.1:${cp[0]} ready x >/dev/null 2>&1 && "$bin" put --addr 127.0.0.1:${cp[1]} ready x >/dev/null 2>&1 && "$bin" put --addr 127.0.0.1:${cp[2]} ready x >/dev/null 2>&1; then ok=1; break; fi
		sleep 0.1 # polling for the cluster's first election
	done
	[ $ok = 1 ] || echo "cluster did not come up: $bin" >&2
done
for r in $(seq "$rounds"); do
	for wc in ${RUNS:-fenced-put:64 lock-cycle:64 fenced-put:16 lock-cycle:16 fenced-put:1 lock-cycle:1}; do
		w=${wc%:*}; c=${wc#*:}
		for bin in "$@"; do
			v=$(basename "$(dirname "$bin")")
			out=$("$bin" bench --addr "${addrs[$bin]}" --workload $w --clients $c --duration $dur --warmup 1s --json --quiet 2>/dev/null)
			python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(sys.argv[2], sys.argv[3], sys.argv[4], round(j["ops_per_sec"]), round(j["latency"]["p50_us"]), j["errors"])' "$out" "$v" $w $c 2>/dev/null || echo "$v $w $c PARSE: ${out:0:200}"
		done
	done
done
for p in "${allpids[@]}"; do kill -TERM $p; done
for p in "${allpids[@]}"; do wait $p 2>/dev/null; done
rm -rf "${dirs[@]}"
