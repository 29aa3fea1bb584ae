package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"
)

// completeFlag is what a shell's completion function appends to the words
// typed so far to ask fencekv for the next ones (urfave/cli's protocol).
const completeFlag = "--generate-bash-completion"

// The completion scripts ask fencekv itself for the commands, subcommands
// and flags that fit (urfave/cli's scripts, for the program named
// fencekv).
const bashCompletion = `# bash completion for fencekv: eval "$(fencekv completion bash)"
_fencekv_complete() {
  local cur words
  COMPREPLY=()
  cur="${COMP_WORDS[COMP_CWORD]}"
  words=("${COMP_WORDS[@]:0:$COMP_CWORD}")
  local opts
  if [[ "$cur" == -* ]]; then
    opts=$("${words[@]}" "$cur" ` + completeFlag + ` 2>/dev/null)
  else
    opts=$("${words[@]}" ` + completeFlag + ` 2>/dev/null)
  fi
  COMPREPLY=($(compgen -W "${opts}" -- "${cur}"))
  return 0
}
complete -o bashdefault -o default -F _fencekv_complete fencekv
`

const zshCompletion = `#compdef fencekv
# zsh completion for fencekv: eval "$(fencekv completion zsh)"
_fencekv() {
  local -a opts
  local cur
  cur=${words[-1]}
  if [[ "$cur" == -* ]]; then
    opts=("${(@f)$(${words[@]:0:#words[@]-1} ${cur} ` + completeFlag + ` 2>/dev/null)}")
  else
    opts=("${(@f)$(${words[@]:0:#words[@]-1} ` + completeFlag + ` 2>/dev/null)}")
  fi
  if [[ "${opts[1]}" != "" ]]; then
    _describe 'values' opts
  else
    _files
  fi
}
if [[ "$(basename -- ${(%):-%x})" != "_fencekv" ]]; then
  compdef _fencekv fencekv
fi
`

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script (bash, zsh or fish)",
		ArgsUsage: "bash|zsh|fish",
		UsageText: `fencekv completion bash|zsh|fish

Prints a script that completes fencekv's commands, subcommands and flags.

  bash:  eval "$(fencekv completion bash)"            (in ~/.bashrc)
  zsh:   eval "$(fencekv completion zsh)"             (in ~/.zshrc, after compinit)
  fish:  fencekv completion fish > ~/.config/fish/completions/fencekv.fish`,
		// Its argument is a shell: offer those (urfave/cli would offer
		// "help h", the subcommands a command without any has).
		BashComplete: func(c *cli.Context) {
			if c.NArg() > 0 {
				return
			}
			for _, sh := range []string{"bash", "zsh", "fish"} {
				fmt.Fprintln(c.App.Writer, sh)
			}
		},
		Action: func(c *cli.Context) error {
			if err := nargs(c, 1, 1); err != nil {
				return err
			}
			switch shell := c.Args().First(); shell {
			case "bash":
				_, err := io.WriteString(c.App.Writer, bashCompletion)
				return err
			case "zsh":
				_, err := io.WriteString(c.App.Writer, zshCompletion)
				return err
			case "fish":
				script, err := c.App.ToFishCompletion()
				if err != nil {
					return err
				}
				script = fishShells(script)
				_, err = io.WriteString(c.App.Writer, script)
				return err
			default:
				hint := ""
				if s := suggest(shell, []string{"bash", "zsh", "fish"}); s != "" {
					hint = fmt.Sprintf("; did you mean %s?", s)
				}
				return usagef("completion: %q is not bash, zsh or fish%s", shell, hint)
			}
		},
	}
}

// completing reports whether args ask for completions (the last is
// completeFlag), and returns them without it.
func completing(args []string) (bool, []string) {
	if n := len(args); n > 1 && args[n-1] == completeFlag {
		return true, args[:n-1]
	}
	return false, args
}

// fishShells makes urfave/cli's fish script offer the shells as the
// completion command's argument, where it offers "help h" (the help
// command urfave/cli gives a command without subcommands).
func fishShells(script string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(script, "\n") {
		if strings.Contains(line, "__fish_seen_subcommand_from completion") && strings.Contains(line, "-a 'help h'") {
			line = "complete -c fencekv -n '__fish_seen_subcommand_from completion' -f -a 'bash zsh fish' -d 'shell'\n"
		}
		b.WriteString(line)
	}
	return b.String()
}
