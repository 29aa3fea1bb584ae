// Command fencekv is the fencekv server and its command-line client.
//
// main only builds the app; each subcommand lives in its own file, and the
// work of each is a plain function testable in-process.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == guardArg {
		os.Exit(runGuard(os.Args[2:]))
	}
	os.Exit(run(os.Args, os.Stdin, os.Stdout, os.Stderr))
}

// run executes the CLI with args (args[0] is the program name) and returns
// the process exit status.
//
// An error is printed as one line on stderr, or with --json as one JSON
// object on stdout (see errorJSON), unless the command printed it itself.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app := newApp(stdin, stdout, stderr)
	// A shell asking for completions puts completeFlag last, where
	// urfave/cli looks for it: reorder must not move it.
	complete, args := completing(args)
	args = reorder(app, args)
	if complete {
		args = append(args, completeFlag)
	}
	err := app.Run(args)
	if err == nil {
		return 0
	}
	code := exitCode(err)
	var ec cli.ExitCoder
	switch {
	case errors.As(err, &ec) && ec.Error() == "":
	case jsonRequested(args) && (commandName(args) == "run-locked" || commandName(args) == "elect"):
		writeErrorJSON(stderr, err) // its stdout is its command's
	case jsonRequested(args):
		writeErrorJSON(stdout, err)
	default:
		fmt.Fprintf(stderr, "fencekv: %v\n", err)
	}
	return code
}

func newApp(stdin io.Reader, stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:    "fencekv",
		Usage:   "a key-value store and lock service with fencing tokens",
		Version: versionString(),
		Description: `fencekv is a lock service and the storage the locks protect, in one
transactional boundary. Every lock grant carries a fencing token; every key
keeps the highest token that wrote it; a write with an older token is refused.

Start a server with 'fencekv serve', then use the client commands against it
(--addr or FENCEKV_ADDR, default 127.0.0.1:7420).

Exit status: 0 ok; 1 server or connection error; 2 usage error (bad
arguments, bad_request, too_large, TLS settings that do not match the
server's); 3 refused by fencing (stale_token, not_holder, lease_expired); 4 lock held (lock_held, wait ran out); 5
condition failed (compare_failed, not_integer); 6 key not found (get);
7 verify found a broken guarantee, or check found damage; 8
unauthenticated (no or wrong credentials); 9 permission_denied. run-locked (and elect)
exits with its command's status, or --lost-status (3) if the lease may
have been lost.

With --json, a command prints one JSON object on stdout: its result, or
its error as {"error": CODE, "message": ...} (run-locked, elect: on stderr).

Shell completion: fencekv completion bash|zsh|fish.`,
		Reader:               stdin,
		Writer:               stdout,
		ErrWriter:            stderr,
		HideHelpCommand:      true,
		Suggest:              true,
		EnableBashCompletion: true,
		ExitErrHandler:       func(*cli.Context, error) {}, // run maps errors to statuses
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			// "fencekv --adr X get k": the nearest global flag.
			return usageError{fmt.Errorf("%w (see 'fencekv --help')", flagHint(&cli.Command{Flags: c.App.Flags}, err))}
		},
		// The client flags are accepted before the command too ("fencekv
		// --addr X get k", as etcdctl and kubectl take them): reorder
		// moves them to the command, which reads them.
		Flags: clientFlags(),
		Commands: []*cli.Command{
			serveCommand(),
			checkCommand(),
			backupCommand(),
			restoreCommand(),
			pingCommand(),
			statusCommand(),
			membersCommand(),
			refusalsCommand(),
			txnCommand(),
			watchCommand(),
			getCommand(),
			putCommand(),
			delCommand(),
			casCommand(),
			incrCommand(),
			scanCommand(),
			lockCommand(),
			runLockedCommand(),
			electCommand(),
			leaderCommand(),
			versionCommand(),
			verifyCommand(),
			verifyClientCommand(),
			benchCommand(),
			authCommand(),
			completionCommand(),
		},
	}
	app.Action = helpOrUnknown(cli.ShowAppHelp, "fencekv", app.Commands)
	strictUsage(app.Commands)
	return app
}

// strictUsage makes every usage mistake exit 2 with a one-line message on
// stderr. Left alone, urfave/cli gives subcommands no OnUsageError (a bad
// flag prints the help to stdout and exits 1), and answers an unknown
// command with "No help topic" and status 3, which here means "fenced".
func strictUsage(cmds []*cli.Command) {
	for _, c := range cmds {
		if c.OnUsageError == nil {
			c.OnUsageError = func(cc *cli.Context, err error, _ bool) error {
				return usageError{fmt.Errorf("%w (see '%s --help')", flagHint(cc.Command, err), cc.Command.HelpName)}
			}
		}
		if len(c.Subcommands) > 0 {
			if c.Action == nil {
				c.HideHelpCommand = true // helpOrUnknown answers "lock help acquire"
				c.Action = helpOrUnknown(cli.ShowSubcommandHelp, "fencekv "+c.Name, c.Subcommands)
			}
			strictUsage(c.Subcommands)
		}
	}
}

// helpOrUnknown is the action of group, a command that only groups cmds
// (or of the app): with no arguments it shows the help, with one it
// refuses the unknown name, with the nearest known one and the group's
// own commands.
func helpOrUnknown(help func(*cli.Context) error, group string, cmds []*cli.Command) cli.ActionFunc {
	return func(c *cli.Context) error {
		switch a := c.Args(); {
		case a.First() == "help" && a.Len() == 1:
			return help(c)
		case a.First() == "help": // "fencekv help put"
			if cli.ShowCommandHelp(c, a.Get(1)) != nil {
				return unknownCommand(group, cmds, a.Get(1))
			}
			return nil
		case a.Present():
			return unknownCommand(group, cmds, a.First())
		}
		return help(c)
	}
}
