package fencekvtest_test

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv/fencekvtest"
)

func TestLogs(t *testing.T) {
	logs := fencekvtest.NewLogs(slog.LevelError)
	log := slog.New(logs)
	log.Info("dropped", "k", 1)
	log.Error("kept", "k", 1, "who", "me")
	want := []string{"kept k=1 who=me"}
	if got := logs.Messages(); !slices.Equal(got, want) {
		t.Fatalf("Messages = %q; want %q", got, want)
	}
	if got := logs.Take(); !slices.Equal(got, want) {
		t.Fatalf("Take = %q; want %q", got, want)
	}
	if got := logs.Messages(); len(got) != 0 {
		t.Fatalf("Messages after Take = %q; want none", got)
	}
}

func TestEventually(t *testing.T) {
	n := 0
	fencekvtest.Eventually(t, 10*time.Second, "the third poll", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("cond called %d times; want 3", n)
	}
}

// TestChild runs TestChildBody in a child process, with arguments and an
// environment of its own, and collects its output in a Buffer.
func TestChild(t *testing.T) {
	cmd := fencekvtest.Child("TestChildBody", []string{"a", "--b"}, "FENCEKVTEST_X=x")
	var out fencekvtest.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "child: x [a --b]\n") {
		t.Fatalf("child printed %q; want its environment and arguments", out.String())
	}
}

func TestChildBody(t *testing.T) {
	args := fencekvtest.AsChild(t)
	fmt.Printf("child: %s %v\n", os.Getenv("FENCEKVTEST_X"), args)
}
