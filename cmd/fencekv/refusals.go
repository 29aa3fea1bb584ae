package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

func refusalsCommand() *cli.Command {
	return &cli.Command{
		Name:  "refusals",
		Usage: "show the fenced writes the server refused (what fencing stopped)",
		UsageText: `fencekv refusals [--since N] [--follow] [--json]

Lists the writes the server refused for their token (stale_token, not_holder,
lease_expired), oldest first: when, the key (and lock), the token presented,
the fence or current holder's token that beat it, whom that token was granted
to (when the server still knows), and the client's address. The server keeps
the latest 10000. --follow keeps printing new ones until interrupted.

Example:
  fencekv refusals --follow`,
		Flags: flags(clientFlags(), []cli.Flag{
			&cli.Uint64Flag{Name: "since", Usage: "only refusals after sequence number `N`"},
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing new refusals until interrupted"},
		}),
		Action: func(c *cli.Context) error {
			since := c.Uint64("since")
			follow := c.Bool("follow")
			return withClient(c, 0, func(ctx context.Context, cl *wire.Client) error {
				if follow {
					ctx = c.Context // runs until interrupted
				}
				shown := 0
				for {
					rs, last, err := cl.Refusals(ctx, since, refusalsPage)
					if err != nil {
						return refused(c, err)
					}
					for _, r := range rs {
						if err := showRefusal(c, r); err != nil {
							return err
						}
					}
					shown += len(rs)
					if len(rs) > 0 {
						// Page on from the last one shown: last is the
						// server's latest, which may be far past it.
						since = rs[len(rs)-1].Seq
					} else {
						since = max(since, last)
					}
					if len(rs) == refusalsPage {
						continue
					}
					if !follow {
						if shown == 0 && !c.Bool("json") {
							fmt.Fprintln(c.App.ErrWriter, "no refusals")
						}
						return nil
					}
					select {
					case <-c.Context.Done():
						return nil
					case <-time.After(500 * time.Millisecond):
					}
				}
			})
		},
	}
}

// refusalsPage is how many refusals the command asks for at a time.
const refusalsPage = 1000

func showRefusal(c *cli.Context, r fencekv.Refusal) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s #%d %s %s %q token %d", r.Time.Format(time.RFC3339Nano), r.Seq, r.Code, r.Op, r.Key, r.Token)
	if r.Lock != "" {
		fmt.Fprintf(&b, " lock %q", r.Lock)
	}
	switch r.Code {
	case fencekv.CodeStaleToken:
		fmt.Fprintf(&b, ": below fence %d", r.Fence)
	case fencekv.CodeNotHolder:
		fmt.Fprintf(&b, ": the lock's holder has token %d", r.Holder)
	}
	if r.GrantedLock != "" {
		fmt.Fprintf(&b, " (token %d was granted on %q to %q)", r.Token, r.GrantedLock, r.GrantedHolder)
	}
	if r.Client != "" {
		fmt.Fprintf(&b, " from %s", r.Client)
	}
	m := map[string]any{
		"seq": r.Seq, "time": r.Time.Format(time.RFC3339Nano), "time_ms": r.Time.UnixMilli(), "code": r.Code, "op": r.Op,
		"token": r.Token, "fence": r.Fence, "holder_token": r.Holder, "client": r.Client,
	}
	setText(m, "key", r.Key)
	setText(m, "lock", []byte(r.Lock))
	setText(m, "granted_lock", []byte(r.GrantedLock))
	setText(m, "granted_holder", []byte(r.GrantedHolder))
	return show(c, b.String(), m)
}
