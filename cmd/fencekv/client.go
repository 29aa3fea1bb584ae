package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

// DefaultAddr is where the client commands look for a server.
const DefaultAddr = "127.0.0.1:7420"

// clientFlags are shared by every command that talks to a server.
func clientFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "addr", Value: DefaultAddr, EnvVars: []string{"FENCEKV_ADDR"}, Usage: "server `ADDRESS` (host:port); a comma-separated list of a cluster's nodes tries each in turn"},
		&cli.DurationFlag{Name: "timeout", Value: 10 * time.Second, EnvVars: []string{"FENCEKV_TIMEOUT"}, Usage: "give up on the server after this long (waits for locks come on top)"},
		&cli.BoolFlag{Name: "json", Usage: "print the result as JSON, for scripts"},
	}, clientSecurityFlags()...) // security.go
}

// writeFlags are the fencing options of the write commands.
func writeFlags() []cli.Flag {
	return []cli.Flag{
		&cli.Uint64Flag{Name: "token", Aliases: []string{"t"}, EnvVars: []string{"FENCEKV_TOKEN"}, Usage: "fencing `TOKEN` of the write (refused if below the key's fence)"},
		&cli.BoolFlag{Name: "strict", Usage: "accept only a token above the key's fence"},
		&cli.StringFlag{Name: "lock", Aliases: []string{"l"}, Usage: "accept only while `LOCK` is held by --token (a held write)"},
	}
}

func writeOptions(c *cli.Context) fencekv.WriteOptions {
	return fencekv.WriteOptions{Token: fencekv.Token(c.Uint64("token")), Strict: c.Bool("strict"), Lock: c.String("lock")}
}

// withClient dials the server and runs fn with a context bounded by
// --timeout plus extra.
func withClient(c *cli.Context, extra time.Duration, fn func(ctx context.Context, cl *wire.Client) error) error {
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout")+extra)
	defer cancel()
	do, err := clientSecurityOf(c).dialOptions()
	if err != nil {
		return err
	}
	cl, err := dial(ctx, c, do)
	if err != nil {
		return err
	}
	defer cl.Close()
	err = fn(ctx, cl)
	if errors.Is(err, wire.ErrClientClosed) {
		err = closedHint(err, do)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		te := timeoutError{fmt.Errorf("no answer from %s within %v (--timeout): %w", c.String("addr"), c.Duration("timeout")+extra, context.DeadlineExceeded), ""}
		if changes[c.Command.Name] {
			te.outcome = fencekv.OutcomeUnknown
		}
		return te
	}
	return err
}

// changes are the client commands that change state: one that was sent
// and not answered in time may still be applied.
var changes = map[string]bool{"put": true, "del": true, "cas": true, "incr": true, "txn": true,
	"acquire": true, "renew": true, "release": true}

// timeoutError is a command that got no answer within --timeout. outcome
// is fencekv.OutcomeUnknown for a command that changes state: it may have
// been sent, and may still be applied (on a cluster, even after a node
// that was stopped resumes).
type timeoutError struct {
	err     error
	outcome string
}

func (e timeoutError) Error() string {
	if e.outcome == fencekv.OutcomeUnknown {
		return e.err.Error() + " (it may still be applied: read before retrying)"
	}
	return e.err.Error()
}

func (e timeoutError) Unwrap() error { return e.err }

// dialError explains a failed dial: a refusal of the credentials keeps
// its code (and exit status); anything else is a server not reached.
func dialError(err error, do *wire.DialOptions) error {
	var fe *fencekv.Error
	var te *wire.TLSError
	switch {
	case errors.As(err, &te):
		return tlsHint(err, te, do)
	case errors.As(err, &fe):
		return err
	}
	return fmt.Errorf("%w (is 'fencekv serve' running there? set --addr or FENCEKV_ADDR)", err)
}

// tlsHint explains a connection TLS refused, te, inside err: a setting of
// this client that does not match the server's, to be fixed, not retried
// (exit status 2, --json error "tls").
func tlsHint(err error, te *wire.TLSError, do *wire.DialOptions) error {
	hasCert := do != nil && do.TLS != nil && (len(do.TLS.Certificates) > 0 || do.TLS.GetClientCertificate != nil)
	var fe *fencekv.Error
	var ve *tls.CertificateVerificationError
	var rhe tls.RecordHeaderError
	msg := te.Error()
	var hint string
	switch {
	case errors.As(te, &fe) && fe.Code == fencekv.CodeTLSRequired:
		hint = "the server requires TLS: set --tls-ca to the CA that issued its certificate (or --tls if a public CA did)"
	case errors.As(te, &ve):
		hint = "the server's certificate was not accepted: set --tls-ca to the CA that issued it, or --tls-server-name to the name it was issued for"
	case errors.As(te, &rhe):
		hint = "the server does not speak TLS: leave out the --tls flags"
	case strings.Contains(msg, "certificate required") && hasCert:
		hint = "the server requires a client certificate that its --tls-client-ca issued, and --tls-cert's was not (a client sends only one the server's CA issued)"
	case strings.Contains(msg, "certificate required"):
		hint = "the server requires a client certificate: set --tls-cert and --tls-key"
	case strings.Contains(msg, "certificate"):
		hint = "the server did not accept this client's certificate: set --tls-cert and --tls-key to one its --tls-client-ca issued, and in date"
	default:
		hint = "a TLS setting does not match the server's: check --tls-ca, --tls-cert, --tls-key and --tls-server-name"
	}
	return tlsConfigError{fmt.Errorf("%s (%s; nothing was sent to the store)", strings.TrimPrefix(err.Error(), "wire: "), hint), te}
}

// tlsConfigError is a TLS refusal explained for people; it unwraps to
// the *wire.TLSError.
type tlsConfigError struct {
	msg error
	te  *wire.TLSError
}

func (e tlsConfigError) Error() string { return e.msg.Error() }
func (e tlsConfigError) Unwrap() error { return e.te }

// closedHint explains a connection the server closed without an answer:
// most often a TLS server refusing a plain client, or a client without the
// certificate it requires.
func closedHint(err error, do *wire.DialOptions) error {
	var fe *fencekv.Error
	var te *wire.TLSError
	switch {
	case errors.As(err, &te):
		return tlsHint(err, te, do)
	case errors.As(err, &fe):
		return err // the server said why (limit_exceeded)
	case do.TLS == nil:
		return fmt.Errorf("%w (the server closed the connection: does it require TLS? set --tls-ca)", err)
	case len(do.TLS.Certificates) == 0:
		return fmt.Errorf("%w (the server closed the connection: does it require a client certificate? set --tls-cert and --tls-key)", err)
	}
	return err
}

// dial connects to the first of --addr's addresses that answers; the
// client reconnects to them (the next first) if its connection breaks.
func dial(ctx context.Context, c *cli.Context, do *wire.DialOptions) (*wire.Client, error) {
	cl, err := wire.DialCluster(ctx, splitList(c.String("addr")), do)
	if err != nil {
		return nil, dialError(err, do)
	}
	return cl, nil
}

// show writes v as JSON with --json, or the human text otherwise.
func show(c *cli.Context, human string, v any) error {
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		return enc.Encode(v)
	}
	_, err := fmt.Fprintln(c.App.Writer, human)
	return err
}

// refused returns a command's error. run prints it (as JSON with --json)
// and maps it to the exit status: a refusal's follows its code.
func refused(_ *cli.Context, err error) error { return err }

func pingCommand() *cli.Command {
	return &cli.Command{
		Name:      "ping",
		Usage:     "check that a server answers",
		UsageText: "fencekv ping [--addr ADDR]\n\nExample:\n  fencekv ping --addr 10.0.0.5:7420 || echo 'no fencekv there'",
		Flags:     clientFlags(),
		Action: func(c *cli.Context) error {
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				start := time.Now()
				v, err := cl.Ping(ctx)
				if err != nil {
					return refused(c, err)
				}
				rtt := time.Since(start)
				return show(c, fmt.Sprintf("pong from %s: fencekv %s in %v", cl.Addr(), v, rtt.Round(time.Microsecond)),
					map[string]any{"version": v, "rtt_us": rtt.Microseconds()})
			})
		},
	}
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:      "status",
		Usage:     "show the server's counters",
		UsageText: "fencekv status [--json]\n\nShows the last token issued, the revision, keys, held locks, queued waiters, and how\nmany commands share each durable commit (and what its log sync costs).\n\nExample:\n  fencekv status --json | jq .last_token",
		Flags:     clientFlags(),
		Action: func(c *cli.Context) error {
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				st, err := cl.Status(ctx)
				if err != nil {
					return refused(c, err)
				}
				per, sync, ckpt := 0.0, time.Duration(0), time.Duration(0)
				if st.Commits > 0 {
					per = float64(st.Commands) / float64(st.Commits)
					sync = st.SyncTime / time.Duration(st.Commits)
				}
				if st.Checkpoints > 0 {
					ckpt = st.CheckpointTime / time.Duration(st.Checkpoints)
				}
				human := fmt.Sprintf("version     %s\nlast token  %d\nrevision    %d\nkeys        %d\nlocks held  %d\nwaiters     %d\n",
					st.Version, st.LastToken, st.Revision, st.Keys, st.Locks, st.Waiters)
				if st.Commits > 0 || st.Role == "single" || st.Role == "" {
					// A cluster node's commits are raft's (its metrics): a
					// single node's own write-ahead log's counters only.
					human += fmt.Sprintf("commits     %d (%.1f commands and %v of log sync each)\ncheckpoints %d (%v each)\n",
						st.Commits, per, sync.Round(time.Microsecond), st.Checkpoints, ckpt.Round(time.Microsecond))
				}
				human += fmt.Sprintf("data size   %d bytes", st.DataSize)
				out := map[string]any{
					"version": st.Version, "last_token": st.LastToken, "revision": st.Revision, "keys": st.Keys,
					"locks": st.Locks, "waiters": st.Waiters, "commits": st.Commits, "commands": st.Commands, "data_size": st.DataSize,
					"sync_us": st.SyncTime.Microseconds(), "checkpoints": st.Checkpoints, "checkpoint_us": st.CheckpointTime.Microseconds(),
					"role": st.Role, "pid": st.PID,
				}
				if st.Role != "single" && st.Role != "" {
					human = fmt.Sprintf("node        %s (%s, term %d)\nleader      %s\napplied     %d of %d committed\n",
						st.Node, st.Role, st.Term, st.Leader, st.AppliedIndex, st.CommitIndex) + human
					out["node"], out["leader"], out["term"] = st.Node, st.Leader, st.Term
					out["commit_index"], out["applied_index"] = st.CommitIndex, st.AppliedIndex
				}
				return show(c, human, out)
			})
		},
	}
}

func versionString() string { return fencekv.Version }

// --version prints what the version command prints.
func init() {
	cli.VersionPrinter = func(c *cli.Context) { fmt.Fprintf(c.App.Writer, "fencekv %s\n", c.App.Version) }
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version",
		Action: func(c *cli.Context) error {
			_, err := fmt.Fprintf(c.App.Writer, "fencekv %s\n", versionString())
			return err
		},
	}
}
