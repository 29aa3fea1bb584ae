# fencekv — see README.md. `make run` starts a server; `make test` runs the checks CI runs.
GO        ?= go
BIN       := bin/fencekv
DATA      ?= ./fencekv-data
LISTEN    ?= 127.0.0.1:7420
FUZZTIME  ?= 10s

.PHONY: all build run test vet fmt-check race bench fuzz clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/fencekv

run: build
	./$(BIN) serve --data $(DATA) --listen $(LISTEN)

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

race:
	$(GO) test -race -count=1 -timeout 20m ./...

test: vet fmt-check race

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME) ./wire

clean:
	rm -rf bin $(DATA)
