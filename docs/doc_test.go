package docs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/fencekv/fencekv/fencekvtest"
)

// bin is the fencekv binary built from this tree (or $FENCEKV_BIN).
var bin string

func TestMain(m *testing.M) {
	if b := os.Getenv("FENCEKV_BIN"); b != "" {
		bin = b
		os.Exit(m.Run())
	}
	b, remove, err := fencekvtest.Build("../cmd/fencekv", "fencekv")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = b
	code := m.Run()
	remove()
	os.Exit(code)
}

// pages are the documents whose links are checked, relative to the
// repository's top directory.
func pages(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, pat := range []string{"*.md", "docs/*.md", "clients/*.md", "clients/*/*.md", "wire/PROTOCOL.md", "examples/*.md", "contrib/*.md"} {
		m, err := filepath.Glob(filepath.Join("..", pat))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	if len(out) < 5 {
		t.Fatalf("found only %v", out)
	}
	return out
}

// commandPages are the documents whose shell blocks are checked.
func commandPages(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"../README.md", "../CONTRIBUTING.md"}, m...)
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// block is a fenced code block of a markdown file.
type block struct {
	lang   string
	body   string
	line   int    // line of the opening fence
	marker string // an HTML comment on one of the two lines before the fence
}

// parse splits a markdown document into its fenced code blocks and the
// rest (prose, with the code blocks blanked out, line numbers kept).
func parse(md string) (blocks []block, prose []string) {
	lines := strings.Split(md, "\n")
	var cur *block
	var fence string
	for i, l := range lines {
		trimmed := strings.TrimSpace(l)
		if cur == nil {
			if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
				fence = trimmed[:3]
				cur = &block{lang: strings.TrimSpace(trimmed[3:]), line: i + 1}
				for j := i - 1; j >= 0 && j >= i-2; j-- {
					if s := strings.TrimSpace(lines[j]); strings.HasPrefix(s, "<!--") {
						cur.marker = s
						break
					}
				}
				prose = append(prose, "")
				continue
			}
			prose = append(prose, l)
			continue
		}
		prose = append(prose, "")
		if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		cur.body += l + "\n"
	}
	return blocks, prose
}

var (
	inlineCode = regexp.MustCompile("`[^`]*`")
	mdLink     = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	heading    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
)

// slug is GitHub's anchor for a heading.
func slug(h string) string {
	h = strings.ReplaceAll(h, "`", "")
	// Links in headings keep their text.
	h = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// anchors lists the anchors of a markdown file's headings.
func anchors(md string) map[string]bool {
	_, prose := parse(md)
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range prose {
		if m := heading.FindStringSubmatch(l); m != nil {
			s := slug(m[2])
			if n := seen[s]; n > 0 {
				out[fmt.Sprintf("%s-%d", s, n)] = true
			} else {
				out[s] = true
			}
			seen[s]++
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
	}
	return out
}

// TestLinks checks that every relative link resolves to a file or
// directory, and every #anchor to a heading of its file.
func TestLinks(t *testing.T) {
	anchorCache := map[string]map[string]bool{}
	checked := 0
	for _, page := range pages(t) {
		_, prose := parse(read(t, page))
		for n, l := range prose {
			l = inlineCode.ReplaceAllString(l, "")
			for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				where := fmt.Sprintf("%s:%d: link %q", page, n+1, target)
				file, anchor, _ := strings.Cut(target, "#")
				path := page
				if file != "" {
					path = filepath.Join(filepath.Dir(page), file)
					if _, err := os.Stat(path); err != nil {
						t.Errorf("%s: %v", where, err)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(path, ".md") {
					t.Errorf("%s: an anchor into a file that is not markdown", where)
					continue
				}
				a, ok := anchorCache[path]
				if !ok {
					a = anchors(read(t, path))
					anchorCache[path] = a
				}
				if !a[anchor] {
					t.Errorf("%s: %s has no heading with anchor #%s", where, path, anchor)
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked only %d links: is the link pattern broken?", checked)
	}
}

// shellLines returns the command lines of a shell code block, with
// continuation lines joined. In a console block only the lines after a
// "$ " prompt are commands; the others are output.
func shellLines(b block) []string {
	var out []string
	console := b.lang == "console"
	var cur strings.Builder
	in := false
	for _, l := range strings.Split(b.body, "\n") {
		if !in {
			if console {
				s := strings.TrimLeft(l, " ")
				if !strings.HasPrefix(s, "$ ") {
					continue
				}
				l = s[2:]
			}
		}
		if strings.HasSuffix(l, "\\") {
			cur.WriteString(strings.TrimSuffix(l, "\\"))
			cur.WriteByte(' ')
			in = true
			continue
		}
		cur.WriteString(l)
		out = append(out, cur.String())
		cur.Reset()
		in = false
	}
	return out
}

func isShell(lang string) bool {
	switch lang {
	case "sh", "bash", "shell", "console":
		return true
	}
	return false
}

// word is a shell word, or an operator (op true).
type word struct {
	text   string
	op     bool
	quoted []string // the contents of its quoted parts, scanned for commands too
}

// words splits a shell line into words and operators, well enough for the
// commands of these pages: quotes, $( ), pipes, lists, redirections and
// comments.
func words(line string) []word {
	var out []word
	var cur strings.Builder
	var quoted []string
	have := false
	flush := func() {
		if have {
			out = append(out, word{text: cur.String(), quoted: quoted})
		}
		cur.Reset()
		quoted = nil
		have = false
	}
	op := func(s string) {
		flush()
		out = append(out, word{text: s, op: true})
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			flush()
		case c == '#' && !have:
			return out // a comment
		case c == '\'' || c == '"':
			j := strings.IndexByte(line[i+1:], c)
			if j < 0 {
				j = len(line) - i - 1
			}
			s := line[i+1 : i+1+j]
			cur.WriteString(s)
			quoted = append(quoted, s)
			have = true
			i += j + 1
		case c == '\\' && i+1 < len(line):
			cur.WriteByte(line[i+1])
			have = true
			i++
		case c == '$' && i+1 < len(line) && line[i+1] == '(':
			op("$(")
			i++
		case c == '(' || c == ')' || c == ';':
			op(string(c))
		case c == '|' || c == '&':
			if i+1 < len(line) && line[i+1] == c {
				op(string([]byte{c, c}))
				i++
			} else {
				op(string(c))
			}
		case c == '>' || c == '<':
			if have && strings.Trim(cur.String(), "0123456789") == "" {
				cur.Reset() // a file descriptor: 2>
				have = false
			}
			flush()
			j := i + 1
			for j < len(line) && (line[j] == '>' || line[j] == '&' || (line[j] >= '0' && line[j] <= '9')) {
				j++
			}
			r := line[i:j]
			i = j - 1
			out = append(out, word{text: r, op: true})
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	flush()
	return out
}

// command is one fencekv invocation found in a page.
type command struct {
	where string
	args  []string
}

var keywords = map[string]bool{"until": true, "while": true, "if": true, "then": true, "do": true, "else": true,
	"!": true, "time": true, "exec": true, "nohup": true, "{": true}

// commands finds the fencekv invocations of a shell line, in command
// position, also inside quoted strings (sh -c '...', "$(...)").
func commands(where, line string) []command {
	var out []command
	ws := words(line)
	start := true
	for i := 0; i < len(ws); i++ {
		w := ws[i]
		for _, q := range w.quoted {
			out = append(out, commands(where, q)...)
		}
		if w.op {
			// A redirection's target is not a command; anything else
			// starts one.
			start = !strings.ContainsAny(w.text, "<>")
			if strings.ContainsAny(w.text, "<>") && !strings.Contains(w.text, "&") && i+1 < len(ws) && !ws[i+1].op {
				i++
				start = false
			}
			continue
		}
		if !start {
			continue
		}
		if keywords[w.text] || regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`).MatchString(w.text) {
			continue // still in command position
		}
		start = false
		if w.text != "fencekv" && w.text != "bin/fencekv" && w.text != "./bin/fencekv" {
			continue
		}
		var args []string
		for j := i + 1; j < len(ws) && !ws[j].op; j++ {
			args = append(args, ws[j].text)
		}
		out = append(out, command{where: where, args: args})
	}
	return out
}

// helpInfo is what `fencekv PATH --help` says: its subcommands and flags.
type helpInfo struct {
	subcommands map[string]bool
	flags       map[string]bool
}

var (
	helpMu    sync.Mutex
	helpCache = map[string]*helpInfo{}
	flagName  = regexp.MustCompile(`(?:^|[\s,])(--?[A-Za-z0-9][A-Za-z0-9-]*)`)
)

func help(t *testing.T, path []string) (*helpInfo, error) {
	helpMu.Lock()
	defer helpMu.Unlock()
	key := strings.Join(path, " ")
	if h, ok := helpCache[key]; ok {
		return h, nil
	}
	out, err := exec.Command(bin, append(append([]string(nil), path...), "--help")...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("fencekv %s --help: %v\n%s", key, err, out)
	}
	h := &helpInfo{subcommands: map[string]bool{}, flags: map[string]bool{}}
	section := ""
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(l, " ") && strings.HasSuffix(strings.TrimSpace(l), ":") {
			section = strings.TrimSpace(l)
			continue
		}
		left, _, _ := strings.Cut(strings.TrimSpace(l), "  ")
		switch section {
		case "COMMANDS:":
			for _, n := range strings.Split(left, ",") {
				if n = strings.TrimSpace(n); n != "" && n != "help" && n != "h" {
					h.subcommands[n] = true
				}
			}
		case "OPTIONS:", "GLOBAL OPTIONS:":
			for _, m := range flagName.FindAllStringSubmatch(left, -1) {
				h.flags[m[1]] = true
			}
		}
	}
	if len(h.flags) == 0 {
		return nil, fmt.Errorf("fencekv %s --help lists no flags:\n%s", key, out)
	}
	helpCache[key] = h
	return h, nil
}

// check proves that a command's subcommands and flags exist: each
// subcommand by name in its parent's help, each flag in its command's.
func check(t *testing.T, c command) error {
	var path []string
	h, err := help(t, nil)
	if err != nil {
		return err
	}
	rest := c.args
	for len(rest) > 0 {
		a := rest[0]
		if strings.HasPrefix(a, "-") || len(h.subcommands) == 0 {
			break
		}
		if !h.subcommands[a] {
			return fmt.Errorf("fencekv %s has no command %q", strings.Join(path, " "), a)
		}
		path = append(path, a)
		rest = rest[1:]
		if h, err = help(t, path); err != nil {
			return err
		}
	}
	if len(path) == 0 && !(len(rest) > 0 && (rest[0] == "--help" || rest[0] == "--version" || rest[0] == "-h" || rest[0] == "-v")) {
		return fmt.Errorf("no command")
	}
	if len(h.subcommands) > 0 && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		return fmt.Errorf("fencekv %s has no command %q", strings.Join(path, " "), rest[0])
	}
	for _, a := range rest {
		if a == "--" {
			break // run-locked's command follows
		}
		if !strings.HasPrefix(a, "-") || a == "-" || regexp.MustCompile(`^-\d`).MatchString(a) {
			continue
		}
		name, _, _ := strings.Cut(a, "=")
		if !h.flags[name] {
			return fmt.Errorf("fencekv %s has no flag %s", strings.Join(path, " "), name)
		}
	}
	return nil
}

// TestCommandsParse checks every fencekv command line shown in a shell
// block of README.md and docs/, and in the example scripts: its
// subcommands and flags must exist in the real CLI.
func TestCommandsParse(t *testing.T) {
	var all []command
	for _, page := range commandPages(t) {
		blocks, _ := parse(read(t, page))
		for _, b := range blocks {
			if !isShell(b.lang) {
				continue
			}
			for _, l := range shellLines(b) {
				all = append(all, commands(fmt.Sprintf("%s (block at line %d): %s", page, b.line, strings.TrimSpace(l)), l)...)
			}
		}
	}
	scripts, _ := filepath.Glob("../examples/*.sh")
	for _, s := range scripts {
		for n, l := range shellLines(block{lang: "sh", body: read(t, s)}) {
			all = append(all, commands(fmt.Sprintf("%s:%d: %s", s, n+1, strings.TrimSpace(l)), l)...)
		}
	}
	if len(all) < 60 {
		t.Fatalf("found only %d fencekv commands: is the scan broken?", len(all))
	}
	for _, c := range all {
		if err := check(t, c); err != nil {
			t.Errorf("%s\n\t%v", c.where, err)
		}
	}
}

// TestCommandCheckCatchesMistakes makes sure the checks above can fail.
func TestCommandCheckCatchesMistakes(t *testing.T) {
	for _, line := range []string{
		"fencekv put k v --tokn 1",
		"fencekv lock aquire x",
		"fencekv frobnicate",
		"T=$(fencekv lock acquire x --ttl 1s --bogus)",
		`sh -c 'fencekv get k --nope'`,
		"fencekv --addr 127.0.0.1:1 get k",
	} {
		cs := commands(line, line)
		if len(cs) != 1 {
			t.Errorf("%s: found %d commands, want 1", line, len(cs))
			continue
		}
		if err := check(t, cs[0]); err == nil {
			t.Errorf("%s: passed the check", line)
		}
	}
	for _, line := range []string{
		"echo hi > fencekv",
		"install -m 755 bin/fencekv /usr/local/bin/fencekv",
		"cd fencekv-tls",
	} {
		if cs := commands(line, line); len(cs) != 0 {
			t.Errorf("%s: found commands %v", line, cs)
		}
	}
}

// freePort returns a loopback port nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// serve starts fencekv serve with args on a fresh data dir and returns
// its client address once it accepts connections. It is stopped by PID
// when the test ends.
func serve(t *testing.T, args ...string) string {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	var log bytes.Buffer
	cmd := exec.Command(bin, append([]string{"serve", "--data", t.TempDir(), "--listen", addr}, args...)...)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("server log:\n%s", log.String())
		}
	})
	fencekvtest.Eventually(t, 10*time.Second, "the server at "+addr, func() bool {
		select {
		case <-exited:
			t.Fatalf("the server exited:\n%s", log.String())
		default:
		}
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}

// markedBlock returns the code block of a page that follows an HTML
// comment starting with marker.
func markedBlock(t *testing.T, page, marker string) block {
	t.Helper()
	blocks, _ := parse(read(t, page))
	for _, b := range blocks {
		if strings.HasPrefix(b.marker, marker) {
			return b
		}
	}
	t.Fatalf("%s has no code block marked %q", page, marker)
	return block{}
}

var normalisers = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT[0-9:.]+Z`), "<time>"},
	{regexp.MustCompile(`127\.0\.0\.1:\d+`), "<addr>"},
	{regexp.MustCompile(`fencekv \d+\.\d+\.\d+\S*`), "fencekv <version>"},
	{regexp.MustCompile(`\d+(\.\d+)?(ns|µs|us|ms|s|m|h)\b`), "<duration>"},
}

func normalise(s string) string {
	for _, n := range normalisers {
		s = n.re.ReplaceAllString(s, n.with)
	}
	return strings.TrimRight(s, " \t")
}

// TestTour runs the README's tour against a real server and compares what
// each command prints with what the README shows, up to times, addresses,
// durations and the version.
func TestTour(t *testing.T) {
	b := markedBlock(t, "../README.md", "<!-- tour")
	type step struct {
		cmd  string
		want []string
	}
	var steps []*step
	lines := strings.Split(strings.TrimRight(b.body, "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case strings.HasPrefix(l, "$ "):
			cmd := l[2:]
			for strings.HasSuffix(cmd, "\\") && i+1 < len(lines) {
				i++
				cmd += "\n" + lines[i]
			}
			steps = append(steps, &step{cmd: cmd})
		case strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#"):
		default:
			if len(steps) == 0 {
				t.Fatalf("README tour: output %q before any command", l)
			}
			s := steps[len(steps)-1]
			s.want = append(s.want, normalise(l))
		}
	}
	if len(steps) < 10 {
		t.Fatalf("the tour has only %d commands", len(steps))
	}

	addr := serve(t, "--http", "")
	dir := t.TempDir()
	var script strings.Builder
	script.WriteString("__s=0\n")
	for i, s := range steps {
		// The marker is printed between commands; (exit $__s) gives the
		// next command the status of the one before, for `echo $?`.
		fmt.Fprintf(&script, "printf '@@step %d@@\\n'; (exit $__s)\n{ %s\n} 2>&1; __s=$?\n", i, s.cmd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "FENCEKV_ADDR="+addr, "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil && ctx.Err() != nil {
		t.Fatalf("the tour timed out: %v\n%s", err, out)
	}
	got := map[int][]string{}
	cur := -1
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "@@step ") && strings.HasSuffix(l, "@@") {
			cur, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(l, "@@step "), "@@"))
			continue
		}
		got[cur] = append(got[cur], normalise(l))
	}
	for i, s := range steps {
		if strings.Join(got[i], "\n") != strings.Join(s.want, "\n") {
			t.Errorf("tour step %d: $ %s\nprinted:\n%s\nREADME shows:\n%s", i, s.cmd,
				strings.Join(got[i], "\n"), strings.Join(s.want, "\n"))
		}
	}
}

// portsFree reports whether nothing listens on these loopback ports, TCP
// or UDP.
func portsFree(ports []int) bool {
	for _, p := range ports {
		a := fmt.Sprintf("127.0.0.1:%d", p)
		l, err := net.Listen("tcp", a)
		if err != nil {
			return false
		}
		l.Close()
		u, err := net.ListenPacket("udp", a)
		if err != nil {
			return false
		}
		u.Close()
	}
	return true
}

// runWalkthrough runs a walk-through's block as one bash script in a new
// directory that has bin/fencekv, after rewrite, and returns what it
// printed. Servers it left running are stopped through its *.pid files.
func runWalkthrough(t *testing.T, body string, within time.Duration) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, filepath.Join(dir, "bin", "fencekv")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pids, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
		more, _ := filepath.Glob(filepath.Join(dir, "*", "*.pid"))
		for _, f := range append(pids, more...) {
			b, _ := os.ReadFile(f)
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", body)
	cmd.Dir = dir
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
		more, _ := filepath.Glob(filepath.Join(dir, "*", "*.log"))
		var b strings.Builder
		for _, l := range append(logs, more...) {
			c, _ := os.ReadFile(l)
			fmt.Fprintf(&b, "--- %s\n%s", filepath.Base(l), c)
		}
		t.Fatalf("the walk-through failed: %v\n%s\n%s", err, out, b.String())
	}
	return string(out)
}

func wantLines(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("the walk-through did not print %q; it printed:\n%s", w, out)
		}
	}
}

// TestClusterWalkthrough runs docs/cluster.md's walk-through: three
// nodes, a kill -9 of the leader, a failover, a restart of the killed
// node. Its ports (127.0.0.1:75xx) move to a free block (127.0.0.1:NNNxx).
func TestClusterWalkthrough(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("skipped the cluster walk-through: curl is missing; install with apt-get install curl")
	}
	body := markedBlock(t, "cluster.md", "<!-- walkthrough: cluster").body
	if !strings.Contains(body, "127.0.0.1:75") {
		t.Fatal("the cluster walk-through no longer uses 127.0.0.1:75xx")
	}
	var prefix int
	for tries := 0; ; tries++ {
		prefix = 200 + rand.IntN(400) // ports 20021 to 59983
		var ports []int
		for _, tens := range []int{2, 3, 4, 8} {
			for n := 1; n <= 3; n++ {
				ports = append(ports, prefix*100+tens*10+n)
			}
		}
		if portsFree(ports) {
			break
		}
		if tries > 20 {
			t.Fatal("found no free block of ports")
		}
	}
	body = strings.ReplaceAll(body, "127.0.0.1:75", fmt.Sprintf("127.0.0.1:%d", prefix))
	out := runWalkthrough(t, body, 90*time.Second)
	wantLines(t, out, "OK fence=1 revision=1", "OK fence=1 revision=2", "held by token 1", "v2\n")
	if strings.Count(out, "leader") < 2 {
		t.Errorf("members did not show a leader twice:\n%s", out)
	}
}

// TestTLSWalkthrough runs docs/security.md's walk-through: openssl
// certificates, an auth file, a TLS server, then mutual TLS. Its port
// moves to a free one.
func TestTLSWalkthrough(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("skipped the TLS walk-through: openssl is missing; install with apt-get install openssl")
	}
	body := markedBlock(t, "security.md", "<!-- walkthrough: tls").body
	if !strings.Contains(body, "127.0.0.1:7620") {
		t.Fatal("the TLS walk-through no longer uses 127.0.0.1:7620")
	}
	body = strings.ReplaceAll(body, "127.0.0.1:7620", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	out := runWalkthrough(t, body, 60*time.Second)
	wantLines(t, out, "unauthenticated", "refused: exit 8", "OK fence=0 revision=1",
		"permission_denied", "refused: exit 9", "OK fence=0 revision=2", "v42\n")
}
