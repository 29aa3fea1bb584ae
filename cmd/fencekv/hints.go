package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
)

// Help for typos: a mistyped command, subcommand or flag is answered with
// the nearest name ("did you mean"), and a duration without a unit with
// how to write one.

// suggest returns the name among names nearest to typed, or "" if none is
// near enough to be what was meant.
func suggest(typed string, names []string) string {
	best, bestD := "", 0
	for _, n := range names {
		d := editDistance(strings.ToLower(typed), strings.ToLower(n))
		// A typo or two, or a prefix of the name ("stat" for "status").
		near := d <= max(1, len(n)/3) || len(typed) >= 2 && strings.HasPrefix(n, typed)
		if near && (best == "" || d < bestD) {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Damerau-Levenshtein distance (optimal string
// alignment): insertions, deletions, substitutions and transpositions of
// neighbours each count one.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range rb {
		d[0][j+1] = j + 1
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// commandNames are the names (and aliases) of the visible commands.
func commandNames(cmds []*cli.Command) []string {
	var names []string
	for _, c := range cmds {
		if !c.Hidden {
			names = append(names, c.Names()...)
		}
	}
	return names
}

// unknownCommand is the usage error for a command name that is not one
// of cmds, the commands of group ("fencekv" or "fencekv lock").
func unknownCommand(group string, cmds []*cli.Command, typed string) error {
	msg := fmt.Sprintf("unknown command %q", typed)
	if group != "fencekv" {
		msg += " for '" + group + "'"
	}
	if s := suggest(typed, commandNames(cmds)); s != "" {
		msg += fmt.Sprintf("; did you mean '%s %s'?", group, s)
	}
	if group != "fencekv" {
		var names []string
		for _, c := range cmds {
			if !c.Hidden {
				names = append(names, c.Name)
			}
		}
		msg += fmt.Sprintf(" (its commands: %s; see '%s --help')", strings.Join(names, ", "), group)
	} else {
		msg += " (see 'fencekv --help')"
	}
	return usageError{fmt.Errorf("%s", msg)}
}

var (
	undefinedFlag = regexp.MustCompile(`^flag provided but not defined: -+(\S+)$`)
	badFlagValue  = regexp.MustCompile(`^invalid value "(.*)" for flag -+(\S+): parse error$`)
)

// flagHint rewrites urfave/cli's error for a flag of cmd: an unknown flag
// gets the nearest known one; a duration given without a unit ("--ttl
// 10") gets how to write it.
func flagHint(cmd *cli.Command, err error) error {
	if cmd == nil {
		return err
	}
	msg := err.Error()
	if m := undefinedFlag.FindStringSubmatch(msg); m != nil {
		var names []string
		for _, f := range cmd.Flags {
			names = append(names, f.Names()...)
		}
		if s := suggest(m[1], names); s != "" {
			return fmt.Errorf("unknown flag %s; did you mean %s?", flagName(m[1]), flagName(s))
		}
		return fmt.Errorf("unknown flag %s", flagName(m[1]))
	}
	if m := badFlagValue.FindStringSubmatch(msg); m != nil {
		for _, f := range cmd.Flags {
			if _, ok := f.(*cli.DurationFlag); !ok || !hasName(f, m[2]) {
				continue
			}
			if _, perr := strconv.ParseFloat(m[1], 64); perr == nil {
				return fmt.Errorf("--%s %s: a duration needs a unit: write %ss (or %sms, %sm)", m[2], m[1], m[1], m[1], m[1])
			}
			return fmt.Errorf("--%s %q is not a duration: write it like 10s, 500ms, 2m or 1h30m", m[2], m[1])
		}
	}
	return err
}

// flagName is how a flag is written: -t, --token.
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

func hasName(f cli.Flag, name string) bool {
	for _, n := range f.Names() {
		if n == name {
			return true
		}
	}
	return false
}
