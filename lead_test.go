package fencekv

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv/state"
)

// queued is the number of writes waiting for a leader.
func queued(db *DB) int {
	db.qmu.Lock()
	defer db.qmu.Unlock()
	return len(db.pending)
}

// TestStartLed: a caller made the leader by StartLed queues every write
// started after it (and a waiting Put) without any of them committing,
// then commits them all in one batch with Lead, their callbacks run
// before Lead returns; PassLead hands the lead to a committer instead.
func TestStartLed(t *testing.T) {
	db, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	before := db.commits.Load()
	res := make(chan state.Result, 4)
	then := func(r state.Result) { res <- r }
	put := func(k string) state.Command {
		return state.Command{Op: state.OpPut, Key: []byte(k), Value: []byte("v")}
	}
	if !db.StartLed(ctx, put("k1"), WriteOptions{}, then) {
		t.Fatal("StartLed on an idle DB did not make the caller the leader")
	}
	if db.StartLed(ctx, put("k2"), WriteOptions{}, then) {
		t.Fatal("StartLed behind a held lead made the caller the leader again")
	}
	waited := make(chan error, 1)
	go func() {
		_, err := db.Put(ctx, []byte("k3"), []byte("v"), WriteOptions{})
		waited <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for queued(db) < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the waiting put never queued")
		}
		time.Sleep(time.Millisecond)
	}
	if len(res) != 0 || db.commits.Load() != before {
		t.Fatal("a write was committed before the leader led")
	}
	// A bad write is refused at once, lead or not, and takes no lead.
	if db.StartLed(ctx, state.Command{Op: state.OpPut, Value: []byte("v")}, WriteOptions{}, then) {
		t.Fatal("a refused write made the caller the leader")
	}
	if r := <-res; r.Err == nil {
		t.Fatal("a put without a key was accepted")
	}
	db.Lead()
	if len(res) != 2 {
		t.Fatalf("%d started writes answered when Lead returned; want 2", len(res))
	}
	for range 2 {
		if r := <-res; r.Err != nil || r.Entry.Revision == 0 {
			t.Fatalf("started put: %+v", r)
		}
	}
	if err := <-waited; err != nil {
		t.Fatalf("waiting put: %v", err)
	}
	if got := db.commits.Load() - before; got != 1 {
		t.Fatalf("%d commits for the three puts; want 1", got)
	}
	for _, k := range []string{"k1", "k2", "k3"} {
		if e, err := db.Get(ctx, []byte(k)); err != nil || string(e.Value) != "v" {
			t.Fatalf("%s = %q, %v after Lead", k, e.Value, err)
		}
	}

	if !db.StartLed(ctx, put("k4"), WriteOptions{}, then) {
		t.Fatal("StartLed on an idle DB did not make the caller the leader")
	}
	db.PassLead()
	select {
	case r := <-res:
		if r.Err != nil {
			t.Fatalf("put after PassLead: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no committer took the lead PassLead handed on")
	}
}

// batchSizes records the number of commands of each commit.
type batchSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (b *batchSizes) Committed(n int, _ time.Duration) {
	b.mu.Lock()
	b.sizes = append(b.sizes, n)
	b.mu.Unlock()
}

func (b *batchSizes) Checkpointed(time.Duration) {}

// TestBatchCountsTxnBytes: a transaction's ops count towards the batch's
// bytes. They once counted nothing, so a batch took up to MaxBatch
// transactions of up to 1.5 MiB each: a log record past wal.MaxRecord
// failed the store for every later write (found in review).
func TestBatchCountsTxnBytes(t *testing.T) {
	sizes := &batchSizes{}
	o := DefaultOptions()
	o.NoSync = true
	o.Observer = sizes
	db, err := Open(t.TempDir(), &o)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	res := make(chan state.Result, 1)
	if !db.StartLed(ctx, state.Command{Op: state.OpPut, Key: []byte("first"), Value: []byte("v")}, WriteOptions{}, func(r state.Result) { res <- r }) {
		t.Fatal("StartLed on an idle DB did not make the caller the leader")
	}
	const n = 100
	value := make([]byte, o.MaxValueSize)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, _, err := db.Txn(ctx, nil, []TxnOp{{Op: state.OpPut, Key: []byte(fmt.Sprintf("big/%d", i)), Value: value}}, WriteOptions{})
			errs <- err
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	for queued(db) < n+1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d transactions queued", queued(db)-1, n)
		}
		time.Sleep(time.Millisecond)
	}
	db.Lead()
	if r := <-res; r.Err != nil {
		t.Fatal(r.Err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("txn: %v", err)
		}
	}
	if _, err := db.Put(ctx, []byte("after"), []byte("v"), WriteOptions{}); err != nil {
		t.Fatalf("put after the transactions: %v", err)
	}
	sizes.mu.Lock()
	defer sizes.mu.Unlock()
	most := maxBatchBytes/o.MaxValueSize + 1 // a batch takes commands while it holds less than maxBatchBytes
	for _, s := range sizes.sizes {
		if s > most {
			t.Fatalf("batches of %v commands; a batch of 1 MiB transactions may hold %d", sizes.sizes, most)
		}
	}
}

// TestOptionsBoundOneCommand: limits that would let one transaction
// outgrow a log record are refused at Open.
func TestOptionsBoundOneCommand(t *testing.T) {
	o := DefaultOptions()
	o.MaxValueSize = 600 << 20
	if _, err := Open(t.TempDir(), &o); err == nil || !strings.Contains(err.Error(), "for one command") {
		t.Fatalf("Open with MaxValueSize 600 MiB: %v; want refused", err)
	}
}
