#!/usr/bin/env bash
# make cluster: three fencekv nodes on loopback in one terminal.
# Clients on 127.0.0.1:7420, 7421, 7422; raft on 7430-7432; gossip on
# 7440-7442; /metrics, /healthz, /readyz on 7480-7482; data under
# ./fencekv-cluster-data. Ctrl-C stops all three.
set -euo pipefail
bin=${1:-bin/fencekv}
data=${DATA:-./fencekv-cluster-data}
pids=()
stop() {
	trap - INT TERM
	echo "stopping the cluster..."
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop INT TERM
for i in 0 1 2; do
	"$bin" serve --node "n$i" --data "$data/n$i" \
		--listen "127.0.0.1:742$i" --raft "127.0.0.1:743$i" --gossip "127.0.0.1:744$i" --http "127.0.0.1:748$i" \
		--bootstrap-expect 3 --join 127.0.0.1:7440,127.0.0.1:7441,127.0.0.1:7442 \
		> >(sed -u "s/^/n$i | /") 2>&1 &
	pids+=("$!")
done
echo "cluster: clients on 127.0.0.1:7420,127.0.0.1:7421,127.0.0.1:7422 (Ctrl-C stops all three)"
wait
