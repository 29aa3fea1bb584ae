#!/usr/bin/env bash
# Runs `fencekv verify` against a real `fencekv serve` on a temp dir and a free
# loopback port (as `make run` would serve), then stops the server by its PID.
# Usage: verify/live.sh BIN [verify flags...]
set -euo pipefail
bin=$1; shift
dir=$(mktemp -d)
log="$dir/serve.log"
"$bin" serve --data "$dir/data" --listen 127.0.0.1:0 --http "" 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
addr=""
for _ in $(seq 1 100); do
	addr=$(sed -n 's/.*msg="fencekv serving".* addr=\([^ ]*\).*/\1/p' "$log")
	[ -n "$addr" ] && break
	kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
	sleep 0.1
done
[ -n "$addr" ] || { echo "server did not start"; cat "$log"; exit 1; }
"$bin" verify --addr "$addr" "$@"
