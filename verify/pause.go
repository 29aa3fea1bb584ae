package verify

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
)

// A paused client speaks a line protocol with the verifier:
//
//	client: token N [unknown]  (it holds the lock)
//	verifier: go               (after SIGSTOP ... SIGCONT)
//	client: ok | refused CODE [TOKEN]
//
// so that the pause falls exactly between the grant and the write. The
// client retries through a failover until its write is answered; the
// verifier then reads the key, so a write whose first attempt had an
// unknown outcome is judged by what it did. "unknown" says one of the
// client's acquire attempts had an unknown outcome, so it may still be
// granted after the client's grant (on a cluster, a node stopped with the
// request unread serves it when it resumes); a refusal's TOKEN is the
// lock's holder that not_holder names.

// ClientMain is the paused client: it acquires a lock, reports its token,
// waits for a line on stdin, then writes a key with its token (and, with
// -held, naming the lock) and reports the outcome. It returns the process
// exit status. fencekv verify runs it in a child process.
func ClientMain(args []string, stdin io.Reader, stdout io.Writer) int {
	return ClientMainWith(args, stdin, stdout, nil)
}

// ClientMainWith is ClientMain dialing with o's TLS and credentials.
func ClientMainWith(args []string, stdin io.Reader, stdout io.Writer, o *wire.DialOptions) int {
	return ClientMainTarget(args, stdin, stdout, o, nil)
}

// ClientMainTarget is ClientMainWith writing to t (nil: fencekv's keys),
// the paused client of a run with Config.Target.
func ClientMainTarget(args []string, stdin io.Reader, stdout io.Writer, o *wire.DialOptions, t Target) int {
	fs := flag.NewFlagSet("verify-client", flag.ContinueOnError)
	fs.SetOutput(stdout)
	addr := fs.String("addr", "", "server address (or a cluster's nodes, comma-separated)")
	lock := fs.String("lock", "", "lock to acquire")
	key := fs.String("key", "", "key to write")
	ttl := fs.Duration("ttl", time.Second, "lease length")
	held := fs.Bool("held", false, "make a held write (naming the lock)")
	holder := fs.String("holder", "", "holder name to acquire under (default: a fresh one)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx := context.Background()
	c, err := newConn(*addr, o)
	if err != nil {
		fmt.Fprintf(stdout, "error %v\n", err)
		return 1
	}
	defer c.Close()
	if *holder == "" {
		*holder = "fencekv verify paused client " + randomID()
	}
	l, unknown, err := c.acquire(ctx, *lock, *ttl, fencekv.AcquireOptions{Holder: *holder})
	if err != nil {
		fmt.Fprintf(stdout, "error %v\n", err)
		return 1
	}
	if unknown {
		fmt.Fprintf(stdout, "token %d unknown\n", l.Token)
	} else {
		fmt.Fprintf(stdout, "token %d\n", l.Token)
	}
	if _, err := bufio.NewReader(stdin).ReadString('\n'); err != nil {
		fmt.Fprintf(stdout, "error %v\n", err)
		return 1
	}
	w := fencekv.WriteOptions{Token: l.Token}
	if *held {
		w.Lock = *lock
	}
	if t != nil {
		err = t.Put(ctx, *key, []byte(pausedValue), l.Token)
	} else {
		err = c.call(ctx, func(cl *wire.Client) error {
			_, err := cl.Put(ctx, []byte(*key), []byte(pausedValue), w)
			return err
		})
	}
	var fe *fencekv.Error
	switch {
	case err == nil:
		fmt.Fprintln(stdout, "ok")
	case errors.As(err, &fe) && fe.Code == fencekv.CodeNotHolder:
		fmt.Fprintf(stdout, "refused %s %d\n", fe.Code, fe.Token)
	case errors.As(err, &fe):
		fmt.Fprintf(stdout, "refused %s\n", fe.Code)
	default:
		fmt.Fprintf(stdout, "error %v\n", err)
		return 1
	}
	return 0
}

// pausedValue is what the paused client writes.
const pausedValue = "written by a client paused past its lease"

type outcome struct {
	held     bool          // the expired-lease variant
	accepted bool          // the paused client's write was accepted
	token    fencekv.Token // the paused client's token
	newer    fencekv.Token // the newer holder's token (stale-token variant)
	late     fencekv.Token // a later grant of the paused client's own acquire that held the lock at its write (expired-lease variant)
}

// pauseRound runs one round. Even rounds: A acquires and is stopped; once
// its lease expires B acquires and writes; A resumes and writes with its
// old token, which must be refused with stale_token. Odd rounds: A is
// stopped past its lease and nobody acquires; A resumes and makes a held
// write, which must be refused with lease_expired: the expired lease's
// record is kept (lease.Retention), and no one else acquires the lock, so
// not_holder is a wrong answer, but for one case: the paused client's own
// acquire had an attempt of unknown outcome, and that attempt was granted
// late, after the lease the client took ran out. The lock's latest grant
// is then above the client's token, and held under the client's name, or
// run out already (lock_info names no holder then; nobody else asks for
// the lock, so no one else can have it).
func pauseRound(ctx context.Context, cfg Config, c *conn, prefix string, i int) (o outcome, err error) {
	o.held = i%2 == 1 && cfg.Target == nil
	lock := fmt.Sprintf("%sround-%d", prefix, i)
	key := fmt.Sprintf("%skey-%d", prefix, i)
	holder := "fencekv verify paused client " + randomID()
	args := []string{"-addr", cfg.Addr, "-lock", lock, "-key", key, "-ttl", cfg.TTL.String(), "-holder", holder}
	if o.held {
		args = append(args, "-held")
	}
	cmd := cfg.Client(args)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return o, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return o, err
	}
	if err := cmd.Start(); err != nil {
		return o, fmt.Errorf("starting the paused client: %w", err)
	}
	pid := cmd.Process.Pid
	defer func() {
		if err != nil {
			syscall.Kill(pid, syscall.SIGCONT)
			cmd.Process.Kill()
		}
		stdin.Close()
		cmd.Wait()
	}()
	lines := bufio.NewReader(stdout)
	line, err := lines.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "token ") {
		return o, fmt.Errorf("paused client: %q %v", strings.TrimSpace(line), err)
	}
	f := strings.Fields(line)
	if len(f) < 2 || len(f) > 3 || len(f) == 3 && f[2] != "unknown" {
		return o, fmt.Errorf("paused client said %q", line)
	}
	t, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return o, fmt.Errorf("paused client said %q", line)
	}
	o.token = fencekv.Token(t)
	mayComeLate := len(f) == 3

	// The pause: a real stopped process, past its lease.
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return o, fmt.Errorf("SIGSTOP: %w", err)
	}
	if err := awaitExpiry(ctx, c, lock, cfg.TTL); err != nil {
		return o, err
	}
	var newer fencekv.Lease
	if !o.held {
		// It waits, in case a late grant of the paused client's own
		// acquire holds the lock (see above).
		newer, _, err = c.acquire(ctx, lock, cfg.TTL*10, fencekv.AcquireOptions{Wait: 10*cfg.TTL + 5*time.Second, Holder: "fencekv verify newer holder " + randomID()})
		if err != nil {
			return o, fmt.Errorf("newer holder: %w", err)
		}
		o.newer = newer.Token
		if newer.Token <= o.token {
			return o, fmt.Errorf("newer grant %d is not above %d: tokens went backwards", newer.Token, o.token)
		}
		if err := put(ctx, cfg, c, key, []byte("written by the newer holder"), fencekv.WriteOptions{Token: newer.Token, Lock: lock}); err != nil {
			return o, fmt.Errorf("newer holder's write: %w", err)
		}
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		return o, fmt.Errorf("SIGCONT: %w", err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		return o, err
	}
	line, err = lines.ReadString('\n')
	line = strings.TrimSpace(line)
	if err != nil {
		return o, fmt.Errorf("paused client after resume: %q %v", line, err)
	}
	switch {
	case line == "ok":
		o.accepted = true
	case !o.held && line == "refused "+string(fencekv.CodeStaleToken):
	case o.held && line == "refused "+string(fencekv.CodeLeaseExpired):
	case o.held && mayComeLate && strings.HasPrefix(line, "refused "+string(fencekv.CodeNotHolder)+" "):
		in, err := c.lockInfo(ctx, lock)
		if err != nil {
			return o, err
		}
		// The refusal named the holder's token at the write, if the
		// lease was live (0 if not): the latest grant is at least that.
		named, err := strconv.ParseUint(strings.TrimPrefix(line, "refused "+string(fencekv.CodeNotHolder)+" "), 10, 64)
		if err != nil || in.Token <= o.token || uint64(in.Token) < named || in.Held && in.Holder != holder {
			return o, fmt.Errorf("paused client's write: unexpected %q (its token %d; the lock: held %v by %q, latest token %d)", line, o.token, in.Held, in.Holder, in.Token)
		}
		o.late = in.Token
	default:
		return o, fmt.Errorf("paused client's write: unexpected %q (its token %d, an acquire attempt of unknown outcome: %v)", line, o.token, mayComeLate)
	}
	// The fence's very edge: the paused client's token is most often
	// several below the newer holder's, so a write one below the fence
	// must be refused too (stale_token, changing nothing).
	const edgeValue = "written one below the fence"
	if !o.held && newer.Token > 1 {
		err := put(ctx, cfg, c, key, []byte(edgeValue), fencekv.WriteOptions{Token: newer.Token - 1})
		switch {
		case err == nil:
			o.accepted = true
		case !errors.Is(err, fencekv.ErrStaleToken):
			return o, fmt.Errorf("write one below the fence: %w", err)
		}
	}
	// What the key holds shows whether the late write landed, whatever
	// its answer said (after a failover a retried write may be refused
	// although its first attempt landed).
	e, err := get(ctx, cfg, c, key)
	if err != nil {
		return o, err
	}
	if string(e.Value) == pausedValue || string(e.Value) == edgeValue {
		o.accepted = true
	}
	if !o.held {
		// The newer holder still holds the lock: it tidies up.
		var err error
		if cfg.Target != nil {
			err = cfg.Target.Delete(ctx, key)
		} else {
			err = c.call(ctx, func(cl *wire.Client) error {
				_, _, err := cl.Delete(ctx, []byte(key), fencekv.WriteOptions{Token: newer.Token, Lock: lock})
				return err
			})
		}
		if err != nil {
			return o, fmt.Errorf("cleanup: %w", err)
		}
		return o, release(ctx, c, lock, newer.Token)
	}
	if o.late != 0 {
		// The late grant is the paused client's: let it go (unless it
		// has run out already).
		if err := release(ctx, c, lock, o.late); err != nil && !errors.Is(err, fencekv.ErrNotHolder) && !errors.Is(err, fencekv.ErrLeaseExpired) {
			return o, fmt.Errorf("releasing the late grant %d: %w", o.late, err)
		}
	}
	if o.accepted {
		return o, cleanup(ctx, c, lock, cfg.TTL, key)
	}
	return o, nil
}
