package verify_test

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/verify"
	"github.com/fencekv/fencekv/wire"
)

// TestLateGrantClientProcess is, in a child of TestVerifyLateGrant, a
// paused client whose acquire had an attempt of unknown outcome that the
// server granted late, after the client's own lease ran out: in a held
// round it takes the lock again under its holder name once resumed (as a
// node that was stopped with the request unread would grant it), then
// makes its held write with its first token. FENCEKV_LATE says how:
// "unknown" as described; "known", the same without saying an attempt was
// unknown; "expired", its write waits until the late grant has run out
// too; "other", the late grant is another holder's. In a stale-token
// round it is the ordinary paused client.
func TestLateGrantClientProcess(t *testing.T) {
	args := fencekvtest.AsChild(t)
	fs := flag.NewFlagSet("late", flag.ContinueOnError)
	addr := fs.String("addr", "", "")
	lock := fs.String("lock", "", "")
	key := fs.String("key", "", "")
	ttl := fs.Duration("ttl", time.Second, "")
	held := fs.Bool("held", false, "")
	holder := fs.String("holder", "", "")
	if err := fs.Parse(args); err != nil {
		os.Exit(2)
	}
	if !*held {
		os.Exit(verify.ClientMain(args, os.Stdin, os.Stdout))
	}
	ctx := context.Background()
	fail := func(err error) {
		fmt.Printf("error %v\n", err)
		os.Exit(1)
	}
	c, err := wire.Dial(ctx, *addr)
	if err != nil {
		fail(err)
	}
	how := os.Getenv("FENCEKV_LATE")
	l, err := c.Acquire(ctx, *lock, *ttl, &fencekv.AcquireOptions{Holder: *holder})
	if err != nil {
		fail(err)
	}
	if how == "known" {
		fmt.Printf("token %d\n", l.Token)
	} else {
		fmt.Printf("token %d unknown\n", l.Token)
	}
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fail(err)
	}
	late, lateTTL := *holder, *ttl
	if how == "other" {
		// Held until well after verify looks at the lock: had it run out
		// by then, lock_info would name no holder, and verify could not
		// tell it from the client's own late grant.
		late, lateTTL = "somebody else", time.Minute
	}
	if _, err := c.Acquire(ctx, *lock, lateTTL, &fencekv.AcquireOptions{Holder: late}); err != nil {
		fail(fmt.Errorf("the late grant: %w", err))
	}
	for how == "expired" {
		in, err := c.LockInfo(ctx, *lock)
		if err != nil {
			fail(err)
		}
		if !in.Held {
			break
		}
		time.Sleep(*ttl / 10)
	}
	_, err = c.Put(ctx, []byte(*key), []byte("late"), fencekv.WriteOptions{Token: l.Token, Lock: *lock})
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeNotHolder {
		fail(fmt.Errorf("held write after the late grant: %v", err))
	}
	fmt.Printf("refused %s %d\n", fe.Code, fe.Token)
	os.Exit(0)
}

// TestVerifyLateGrant: a held write refused not_holder passes only when
// the paused client's acquire had an attempt of unknown outcome and the
// lock's latest grant is above its token and its own (held, which verify
// then releases, or run out); otherwise verify reports the wrong answer.
func TestVerifyLateGrant(t *testing.T) {
	addr := serve(t)
	run := func(how string) (*verify.Report, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return verify.Run(ctx, verify.Config{
			Addr:    addr,
			Rounds:  2, // one stale-token round, one held round
			TTL:     200 * time.Millisecond,
			Clients: 1,
			Updates: 4,
			Client: func(args []string) *exec.Cmd {
				return fencekvtest.Child("TestLateGrantClientProcess", args, "FENCEKV_LATE="+how)
			},
		})
	}
	t.Run("unknown", func(t *testing.T) {
		rep, err := run("unknown")
		if err != nil {
			t.Fatalf("verify: %v\n%v", err, rep)
		}
		if !rep.OK() || rep.HeldRefused != 1 || rep.HeldLate != 1 || rep.StaleRefused != 1 {
			t.Fatalf("held refused %d (late %d), stale refused %d, violations %v; want 1 (1), 1, none\n%v", rep.HeldRefused, rep.HeldLate, rep.StaleRefused, rep.Violations, rep)
		}
		if !strings.Contains(rep.String(), "1 of those refused not_holder") {
			t.Errorf("the report does not tell of the late grant:\n%v", rep)
		}
		c, err := wire.Dial(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		locks, _, err := c.Locks(context.Background(), rep.Prefix, "", 0)
		if err != nil || len(locks) != 0 {
			t.Errorf("locks under %s after verify = %v, %v; want the late grant released", rep.Prefix, locks, err)
		}
	})
	t.Run("expired", func(t *testing.T) {
		rep, err := run("expired")
		if err != nil {
			t.Fatalf("verify: %v\n%v", err, rep)
		}
		if !rep.OK() || rep.HeldRefused != 1 || rep.HeldLate != 1 {
			t.Fatalf("held refused %d (late %d), violations %v; want 1 (1), none\n%v", rep.HeldRefused, rep.HeldLate, rep.Violations, rep)
		}
	})
	for _, how := range []string{"known", "other"} {
		t.Run(how, func(t *testing.T) {
			rep, err := run(how)
			if err == nil || !strings.Contains(err.Error(), `unexpected "refused not_holder`) {
				t.Fatalf("verify = %v; want the not_holder reported as a wrong answer\n%v", err, rep)
			}
		})
	}
}
