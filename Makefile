# fencekv — see README.md. `make run` starts a server; `make test` runs the checks CI runs.
GO        ?= go
BIN       := bin/fencekv
DATA      ?= ./fencekv-data
LISTEN    ?= 127.0.0.1:7420
FUZZTIME  ?= 10s

.PHONY: all build run cluster test vet fmt-check race bench fuzz clean release

all: build

build:
	$(GO) build -o $(BIN) ./cmd/fencekv

run: build
	./$(BIN) serve --data $(DATA) --listen $(LISTEN)

# Three nodes on loopback in one terminal: clients on 127.0.0.1:7420,
# 7421 and 7422, data under ./fencekv-cluster-data. Ctrl-C stops all three.
cluster: build
	bash cluster/run.sh ./$(BIN)

# Vet here, and on macOS and FreeBSD: everything builds there, with
# goroutine connections instead of the event loop and no parent-death
# signal for run-locked's guard.
vet:
	$(GO) vet ./...
	$(GO) vet -tags failpoints ./diskfault ./wal ./kv ./cluster
	GOOS=darwin $(GO) vet ./...
	GOOS=freebsd $(GO) build ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# The wire tests run twice: connections on the event loop (the default on
# Linux), then each served by a goroutine of its own (TLS, clusters, other
# systems, --event-loop=false).
race:
	$(GO) test -race -count=1 -timeout 20m ./...
	FENCEKV_TEST_EVENT_LOOP=0 $(GO) test -race -count=1 -timeout 10m ./wire

test: vet fmt-check race test-sql test-clients test-examples test-bench

# The clients in other languages, against real servers built from this
# tree: each suite runs where its tools are (python3 with msgpack and
# pytest; node 20+ and npm; mvn and a JDK) and otherwise says in one line
# what it skipped and how to install it.
.PHONY: test-clients
test-clients:
	@for s in clients/python/test.sh clients/node/test.sh clients/java/test.sh; do \
		if [ -x "$$s" ]; then echo "== $$s"; bash "$$s" || exit 1; fi; \
	done

# The SQL fence (sqlfence/) against real PostgreSQL and SQLite servers; its
# drivers live in a module of their own (sqlfence/sqlfencetest).
.PHONY: test-sql
test-sql:
	bash sqlfence/sqlfencetest/test.sh

# The inventory examples (examples/inventory: Go, Python, Node, Java)
# against a real PostgreSQL and fencekv: each language whose tools are
# here, and the Go one's own module test. Skips in one line without
# PostgreSQL.
.PHONY: test-examples
test-examples:
	bash examples/inventory/test.sh
	@if [ -x "$$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)/postgres" ]; then \
		cd examples/inventory/go && $(GO) test -count=1 .; \
	else echo "skipped the Go inventory example's test: PostgreSQL missing; install with apt-get install postgresql"; fi

# The report logic of the side-by-side comparison (bench/peers, a module of
# its own): the goals it judges. Runs no server.
.PHONY: test-bench
test-bench:
	cd bench/peers && $(GO) test -count=1 ./cmd/benchpeers

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./...

# Every decoder of outside bytes: the wire, the write-ahead log, its
# commands, lease records, raft's log entries, backup files. Under plain
# `go test` their seed corpora run as tests.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./wire
	$(GO) test -run '^$$' -fuzz '^FuzzFastParse$$' -fuzztime $(FUZZTIME) ./wire
	$(GO) test -run '^$$' -fuzz '^FuzzUnmarshal$$' -fuzztime $(FUZZTIME) ./lease
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeEntry$$' -fuzztime $(FUZZTIME) ./cluster
	$(GO) test -run '^$$' -fuzz '^FuzzReadBackup$$' -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz FuzzOpen -fuzztime $(FUZZTIME) ./wal
	$(GO) test -run '^$$' -fuzz FuzzReadCommand -fuzztime $(FUZZTIME) ./state

# `fencekv verify` with 100 real SIGSTOP pause rounds against a fresh
# `fencekv serve`, then the long runs of the suites that test real server
# processes under faults: linearizability checked with porcupine against one
# server under kill -9 and against a 3-node cluster under 56 faults (kill -9,
# SIGSTOP, partitions through fault proxies), and the crash loop (verify/).
# About fifteen minutes; plain `go test ./verify` runs short versions of all
# of them in about a minute.
# FENCEKV_VERIFY_SEED replays a run's random choices; FENCEKV_VERIFY_ARTIFACTS
# is where a failure leaves its history and visualization.
.PHONY: verify
verify: build
	bash verify/live.sh ./$(BIN) --rounds 100 --ttl 500ms --clients 4 --updates 400
	FENCEKV_VERIFY_LONG=1 $(GO) test -run 'Lin|Crash|GrowFromOne' -count=1 -v -timeout 30m ./verify
	$(GO) test -count=1 -v -timeout 10m ./diskfault
	$(GO) test -run 'ClockDrift|LeaseTimeFromClock|ElectionFailover' -count=1 -v ./cluster

# `fencekv verify` against a 3-node cluster (every node's address, --addr
# a,b,c) while the leader is killed with -9 and restarted, and paused with
# SIGSTOP and continued, over and over (verify/verify_test.go starts the
# nodes on free loopback ports and temp dirs and stops them by PID). It must
# accept no stale write. A few minutes.
.PHONY: verify-cluster
verify-cluster:
	FENCEKV_VERIFY_CLUSTER=1 FENCEKV_VERIFY_FLAGS="--rounds 40 --ttl 1s --clients 4 --updates 300" \
		$(GO) test -run '^TestVerifyCLICluster$$' -count=1 -v -timeout 20m ./verify

clean:
	rm -rf bin dist $(DATA) ./fencekv-cluster-data

# Release binaries for Linux and macOS, amd64 and arm64, in dist/, named
# for the version `git describe` gives (v0.1.0-12-gabc1234, say), with
# SHA256SUMS beside them: `cd dist && sha256sum -c SHA256SUMS`. Static
# (CGO_ENABLED=0), reproducible paths (-trimpath), no symbol tables.
# fencekv.Version is a constant, so the binaries report it as it is in
# fencekv.go; the git version is in the file names, and `go version -m`
# shows the commit each was built from.
RELEASE_VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
RELEASE_TARGETS := linux/amd64 linux/arm64 darwin/amd64 darwin/arm64

release:
	rm -rf dist && mkdir -p dist
	@set -e; for t in $(RELEASE_TARGETS); do \
		os=$${t%/*}; arch=$${t#*/}; \
		out=dist/fencekv-$(RELEASE_VERSION)-$$os-$$arch; \
		echo "building $$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '-s -w' -o $$out ./cmd/fencekv; \
	done
	cd dist && sha256sum fencekv-* > SHA256SUMS
	@cat dist/SHA256SUMS

# The side-by-side comparison with etcd and Redis (bench/peers, a Go module of
# its own). bench-tool builds its driver program; bench-peers installs
# etcd-server and redis-server from Debian if missing, starts all three
# servers on free loopback ports and temp dirs, runs every workload and writes
# bench/RESULTS.md. A few minutes; not part of `make test`.
.PHONY: bench-tool bench-peers
bench-tool:
	cd bench/peers && $(GO) build -o ../../bin/benchpeers ./cmd/benchpeers

bench-peers: build bench-tool
	bash bench/peers/run.sh
