package main

import (
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
)

// reorder lets flags follow positional arguments, as people type them
// ("fencekv put k v --token 7"): urfave/cli stops reading flags at the
// first positional argument, so the flags of the chosen (sub)command are
// moved in front of its positional arguments. Everything after "--" is
// left as it is (run-locked's command line), and so is "-" (stdin) and a
// negative number ("incr k -5").
func reorder(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	rest := args[1:]
	cmds := app.Commands
	var cmd *cli.Command
	var global []string // the client flags given before the command ("fencekv --addr X get k")
	// Walk down the command path: global flags, then command names.
	for len(rest) > 0 {
		a := rest[0]
		if strings.HasPrefix(a, "-") {
			if cmd != nil {
				break
			}
			rest = rest[1:]
			if a == "--" || !isFlagOf(app.Flags, a) || appOwn(a) {
				out = append(out, a)
				continue
			}
			// A client flag: each command reads its own, so it goes to
			// the command (the app's copy is for the help and the
			// usage line).
			global = append(global, a)
			if takesValueIn(app.Flags, a) && len(rest) > 0 {
				global = append(global, rest[0])
				rest = rest[1:]
			}
			continue
		}
		next := find(cmds, a)
		if next == nil {
			break
		}
		cmd = next
		cmds = next.Subcommands
		out = append(out, a)
		rest = rest[1:]
	}
	if cmd == nil {
		out = append(out, global...)
		return append(out, rest...)
	}
	if cmd.SkipFlagParsing {
		out = append(out, global...)
		return append(out, rest...)
	}
	// The global flags come first, so the command's own, after them,
	// win ("fencekv --addr A get k --addr B" reads B).
	rest = append(global, rest...)
	var flags, positional, tail []string
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		switch {
		case a == "--":
			tail = rest[i:]
			i = len(rest)
		case a == "-" || !strings.HasPrefix(a, "-") || isNumber(a):
			positional = append(positional, a)
		default:
			flags = append(flags, a)
			if takesValue(cmd, a) && i+1 < len(rest) {
				i++
				flags = append(flags, rest[i])
			}
		}
	}
	for _, f := range flags {
		if f == "-h" || f == "--help" || f == "-help" {
			// "put k v --help": help for the command, not for a topic "k".
			return append(out, f)
		}
	}
	out = append(out, flags...)
	if len(tail) > 0 {
		// "put k -- -x": the flag parser honours "--" only before the
		// first positional argument, so it goes in front of them all.
		out = append(out, "--")
		tail = tail[1:]
	}
	out = append(out, positional...)
	return append(out, tail...)
}

func find(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// takesValue reports whether the flag arg (like "--token" or "-t") of cmd
// reads the next argument as its value.
func takesValue(cmd *cli.Command, arg string) bool {
	return takesValueIn(cmd.Flags, arg)
}

// takesValueIn is takesValue for one of flags.
func takesValueIn(flags []cli.Flag, arg string) bool {
	name := strings.TrimLeft(arg, "-")
	if strings.Contains(name, "=") {
		return false
	}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n != name {
				continue
			}
			if _, ok := f.(*cli.BoolFlag); ok {
				return false
			}
			return true
		}
	}
	return false
}

// isFlagOf reports whether arg ("--addr", "--addr=X", "-json") names one
// of flags.
func isFlagOf(flags []cli.Flag, arg string) bool {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	for _, f := range flags {
		if hasName(f, name) {
			return true
		}
	}
	return false
}

// appOwn reports whether arg is a flag of the app itself rather than a
// client flag: --help, --version, and the shells' completion request.
func appOwn(arg string) bool {
	switch name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "="); name {
	case "help", "h", "version", "v", "generate-bash-completion":
		return true
	}
	return false
}
