package cluster

import (
	"errors"
	"fmt"
	"sync"

	"github.com/fencekv/fencekv"
	"github.com/hashicorp/raft"
)

// Group commit on the leader: the commands proposed at the same time share
// one raft entry (fencekv.EncodeBatch), so a raft round, the log stores'
// writes and syncs on every node and the FSM's decoding are paid once per
// batch rather than once per command. A proposal never waits for a batch
// to fill: the proposer takes whatever is queued as soon as one of its
// proposeDepth entries in flight has a free slot, so a lone command goes
// out at once, and under load the queue grows while the slots are busy.

// proposeDepth is how many raft entries of batched commands may be in
// flight at once: enough to keep raft's pipeline (leader log write,
// replication, follower log writes, FSM) busy.
const proposeDepth = 4

// maxEntryBytes bounds the keys and values of one entry's commands (a
// command larger than that goes alone).
const maxEntryBytes = 1 << 20

type proposal struct {
	c    fencekv.Command
	res  fencekv.Result
	err  error
	done chan struct{}
}

// proposer batches the commands this node proposes as leader into raft
// entries.
type proposer struct {
	n     *Node
	mu    sync.Mutex // guards queue
	queue []*proposal
	wake  chan struct{} // something was queued
	slots chan struct{} // one value per entry in flight
}

func newProposer(n *Node) *proposer {
	return &proposer{n: n, wake: make(chan struct{}, 1), slots: make(chan struct{}, proposeDepth)}
}

// apply proposes one command (stamped by the caller) and waits for its
// result. An error that is not a *fencekv.Error's refusal says whether
// the command may have been applied.
func (p *proposer) apply(c fencekv.Command) (fencekv.Result, error) {
	pr := &proposal{c: c, done: make(chan struct{})}
	p.mu.Lock()
	p.queue = append(p.queue, pr)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	<-pr.done
	return pr.res, pr.err
}

// run sends the queued commands to raft until the node stops. It runs in
// n.wg.
func (p *proposer) run() {
	defer p.n.wg.Done()
	for {
		select {
		case <-p.wake:
		case <-p.n.stop:
			p.failQueued(errClosed)
			return
		}
		for {
			select {
			case p.slots <- struct{}{}:
			case <-p.n.stop:
				p.failQueued(errClosed)
				return
			}
			batch := p.take()
			if len(batch) == 0 {
				<-p.slots
				break
			}
			cmds := make([]fencekv.Command, len(batch))
			for i, pr := range batch {
				cmds[i] = pr.c
			}
			f := p.n.raft.Apply(fencekv.EncodeBatch(cmds), p.n.cfg.HoldTimeout)
			p.n.wg.Add(1) // safe: this goroutine holds a count
			go func() {
				defer p.n.wg.Done()
				defer func() { <-p.slots }()
				finish(f, batch)
			}()
		}
	}
}

// take removes the next batch from the queue: up to MaxBatch commands and
// about maxEntryBytes of keys and values.
func (p *proposer) take() []*proposal {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, size := 0, 0
	for n < len(p.queue) && n < p.n.opts.MaxBatch {
		s := len(p.queue[n].c.Key) + len(p.queue[n].c.Value)
		if n > 0 && size+s > maxEntryBytes {
			break
		}
		size += s
		n++
	}
	batch := p.queue[:n:n]
	p.queue = p.queue[n:]
	if len(p.queue) == 0 {
		p.queue = nil
	}
	return batch
}

func (p *proposer) failQueued(err error) {
	p.mu.Lock()
	q := p.queue
	p.queue = nil
	p.mu.Unlock()
	for _, pr := range q {
		pr.err = err
		close(pr.done)
	}
}

// finish waits for the entry's outcome and answers each of its commands.
func finish(f raft.ApplyFuture, batch []*proposal) {
	err := f.Error()
	var res []fencekv.Result
	if err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrEnqueueTimeout):
			err = &fencekv.Error{Code: fencekv.CodeUnavailable, Message: "not applied: " + err.Error()}
		default:
			// Lost leadership after the entry was appended, or shut
			// down: it may yet commit.
			err = &fencekv.Error{Code: fencekv.CodeUnavailable, Outcome: fencekv.OutcomeUnknown,
				Message: "outcome unknown: " + err.Error()}
		}
	} else {
		switch r := f.Response().(type) {
		case []fencekv.Result:
			if len(r) == len(batch) {
				res = r
			} else {
				err = &fencekv.Error{Code: fencekv.CodeInternal, Message: fmt.Sprintf("%d results for %d commands", len(r), len(batch))}
			}
		case error:
			err = &fencekv.Error{Code: fencekv.CodeUnavailable, Outcome: fencekv.OutcomeUnknown, Message: r.Error()}
		default:
			err = &fencekv.Error{Code: fencekv.CodeInternal, Message: fmt.Sprintf("unexpected raft response %T", f.Response())}
		}
	}
	for i, pr := range batch {
		if err != nil {
			pr.err = err
		} else {
			pr.res = res[i]
		}
		close(pr.done)
	}
}
