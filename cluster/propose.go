package cluster

import (
	"errors"
	"fmt"
	"sync"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/state"
	"github.com/hashicorp/raft"
)

// Group commit on the leader: the commands proposed at the same time share
// one raft entry (state.EncodeBatch), so a raft round, the log stores'
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

// proposal is a command, or a group of commands that must apply one
// right after the other in one entry (a release and the hand-off of the
// lock it frees).
type proposal struct {
	cmds []state.Command
	res  []state.Result
	err  error
	done chan struct{}
}

// proposer batches the commands this node proposes as leader into raft
// entries.
type proposer struct {
	n      *Node
	mu     sync.Mutex // guards queue, closed
	queue  []*proposal
	closed bool          // the node stopped: nothing more is proposed
	wake   chan struct{} // something was queued
	slots  chan struct{} // one value per entry in flight
}

func newProposer(n *Node) *proposer {
	return &proposer{n: n, wake: make(chan struct{}, 1), slots: make(chan struct{}, proposeDepth)}
}

// apply proposes one command (its term set by the caller) and waits for its
// result. An error that is not a *fencekv.Error's refusal says whether
// the command may have been applied.
func (p *proposer) apply(c state.Command) (state.Result, error) {
	res, err := p.applyGroup(c)
	if err != nil {
		return state.Result{}, err
	}
	return res[0], nil
}

// applyGroup proposes cmds in one entry, one right after the other, and
// waits for their results.
func (p *proposer) applyGroup(cmds ...state.Command) ([]state.Result, error) {
	pr := &proposal{cmds: cmds, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errClosed
	}
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
			var cmds []state.Command
			for _, pr := range batch {
				cmds = append(cmds, pr.cmds...)
			}
			// One time for the whole entry, taken as it goes to raft, from
			// this one goroutine: along the leader's term the log's times
			// never go back (a renew is never judged at a time before an
			// expiry ahead of it).
			now := p.n.now()
			for i := range cmds {
				cmds[i].Now = now
			}
			h := stamps.Load()
			if h != nil {
				h.dispatch(cmds)
			}
			f := p.n.raft.Apply(state.EncodeBatch(cmds), p.n.cfg.HoldTimeout)
			p.n.wg.Go(func() { // safe while Close waits: this goroutine holds a count
				defer func() { <-p.slots }()
				if h != nil {
					f.Error() // waits; finish asks again and gets the same
					h.done(cmds)
				}
				finish(f, batch)
			})
		}
	}
}

// take removes the next batch from the queue: up to MaxBatch commands and
// about maxEntryBytes of keys and values.
func (p *proposer) take() []*proposal {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, cmds, size := 0, 0, 0
	for n < len(p.queue) {
		s := 0
		for i := range p.queue[n].cmds {
			s += p.queue[n].cmds[i].Bytes()
		}
		if n > 0 && (size+s > maxEntryBytes || cmds+len(p.queue[n].cmds) > p.n.opts.MaxBatch) {
			break
		}
		size += s
		cmds += len(p.queue[n].cmds)
		n++
	}
	batch := p.queue[:n:n]
	p.queue = p.queue[n:]
	if len(p.queue) == 0 {
		p.queue = nil
	}
	return batch
}

// failQueued answers every queued proposal with err, for good.
func (p *proposer) failQueued(err error) {
	p.mu.Lock()
	q := p.queue
	p.queue, p.closed = nil, true
	p.mu.Unlock()
	for _, pr := range q {
		pr.err = err
		close(pr.done)
	}
}

// finish waits for the entry's outcome and answers each of its commands.
func finish(f raft.ApplyFuture, batch []*proposal) {
	err := f.Error()
	var res []state.Result
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
		n := 0
		for _, pr := range batch {
			n += len(pr.cmds)
		}
		switch r := f.Response().(type) {
		case []state.Result:
			if len(r) == n {
				res = r
			} else {
				err = &fencekv.Error{Code: fencekv.CodeInternal, Message: fmt.Sprintf("%d results for %d commands", len(r), n)}
			}
		case error:
			err = &fencekv.Error{Code: fencekv.CodeUnavailable, Outcome: fencekv.OutcomeUnknown, Message: r.Error()}
		default:
			err = &fencekv.Error{Code: fencekv.CodeInternal, Message: fmt.Sprintf("unexpected raft response %T", f.Response())}
		}
	}
	for _, pr := range batch {
		if err != nil {
			pr.err = err
		} else {
			pr.res, res = res[:len(pr.cmds):len(pr.cmds)], res[len(pr.cmds):]
		}
		close(pr.done)
	}
}
