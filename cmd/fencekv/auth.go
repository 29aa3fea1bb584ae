package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"github.com/fencekv/fencekv/auth"
	"github.com/urfave/cli/v2"
)

// The auth subcommand: tools for the auth file.

func authCommand() *cli.Command {
	return &cli.Command{
		Name:  "auth",
		Usage: "manage the auth file",
		Subcommands: []*cli.Command{{
			Name:  "hash",
			Usage: "read a secret on stdin and print its HASH for the auth file",
			UsageText: `fencekv auth hash [--cost 10] < SECRET-FILE

Reads one line (without its line ending; 1 to 72 bytes) and prints its
bcrypt hash, the HASH field of an auth file line NAME HASH RIGHT...:

  head -c 24 /dev/urandom | base64 > deploy.secret      # give this to the client
  echo "deploy $(fencekv auth hash < deploy.secret) write:deploy/ lock:deploy" >> auth`,
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "cost", Value: auth.DefaultCost, Usage: "bcrypt cost (each step doubles the time of a check)"},
			},
			Action: func(c *cli.Context) error {
				if c.NArg() > 0 {
					return usagef("auth hash reads the secret on stdin, not as an argument (which others can see)")
				}
				line, err := bufio.NewReader(io.LimitReader(c.App.Reader, 1<<10)).ReadBytes('\n')
				if err != nil && !errors.Is(err, io.EOF) {
					return err
				}
				h, err := auth.Hash(firstLine(line), c.Int("cost"))
				if err != nil {
					return usageError{err}
				}
				_, err = fmt.Fprintln(c.App.Writer, h)
				return err
			},
		}},
	}
}
