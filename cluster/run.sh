#!/usr/bin/env bash
# make cluster: three fencekv nodes on loopback in one terminal.
# Clients on 127.0.0.1:7420, 7421, 7422; raft on 7430-7432; gossip on
# 7440-7442; /metrics, /healthz, /readyz on 7480-7482; data under
# ./fencekv-cluster-data (PORT=7520 and DATA=dir move them). Ctrl-C stops
# all three (exit status 0).
#
# Each node runs in a process group of its own, so that a signal from the
# terminal (Ctrl-C, Ctrl-Z) reaches this script only: to fail one node
# over, kill -9 (or kill -STOP) its pid, printed below and shown by
# 'fencekv members', and start it again by hand with the line printed
# for it.
set -euo pipefail
bin=${1:-bin/fencekv}
data=${DATA:-./fencekv-cluster-data}
port=${PORT:-7420} # clients on PORT+0..2, raft +10, gossip +20, HTTP +60
p() { echo $((port + $1)); }
set -m # background jobs in process groups of their own
pids=()
stopping=0
stop() {
	trap - INT TERM
	stopping=1
	echo "stopping the cluster..."
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	echo "cluster stopped (data kept in $data; 'make cluster' starts it again)"
	exit 0
}
trap stop INT TERM
# node I's command line: the same to start it again by hand.
node() {
	local i=$1
	echo "$bin" serve --node "n$i" --data "$data/n$i" \
		--listen "127.0.0.1:$(p "$i")" --raft "127.0.0.1:$(p $((10 + i)))" --gossip "127.0.0.1:$(p $((20 + i)))" --http "127.0.0.1:$(p $((60 + i)))" \
		--bootstrap-expect 3 --join "127.0.0.1:$(p 20),127.0.0.1:$(p 21),127.0.0.1:$(p 22)"
}
for i in 0 1 2; do
	# shellcheck disable=SC2046 # node prints words without spaces in them
	$(node "$i") > >(sed -u "s/^/n$i | /") 2>&1 &
	pids+=("$!")
done
echo "cluster: clients on 127.0.0.1:$(p 0),127.0.0.1:$(p 1),127.0.0.1:$(p 2); Ctrl-C stops all three"
for i in 0 1 2; do
	echo "  n$i: pid ${pids[$i]}"
done
echo "to fail a node over: kill -9 PID (or kill -STOP PID, then kill -CONT PID)"
echo "to start a killed node again, in another terminal, from this directory:"
for i in 0 1 2; do
	echo "  n$i: $(node "$i")"
done
# A node killed by hand does not end the others: wait for them all (or
# for Ctrl-C).
wait
echo "every node has exited"
