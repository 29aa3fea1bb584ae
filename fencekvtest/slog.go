package fencekvtest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// Logs is a slog.Handler that keeps, as text, the records logged at or
// above a level, for a test to read: a server given
// slog.New(fencekvtest.NewLogs(slog.LevelError)) as its logger shows
// whether it logged an error (such as a recovered panic). Each record is
// kept as its message followed by " key=value" for each of its
// attributes; attributes and groups added with With or WithGroup are
// dropped. It is safe for concurrent use.
type Logs struct {
	level slog.Leveler

	mu   sync.Mutex // guards msgs
	msgs []string
}

var _ slog.Handler = (*Logs)(nil)

// NewLogs returns a Logs that keeps the records at level and above.
func NewLogs(level slog.Leveler) *Logs { return &Logs{level: level} }

func (h *Logs) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }
func (h *Logs) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *Logs) WithGroup(string) slog.Handler                { return h }

func (h *Logs) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	h.mu.Lock()
	h.msgs = append(h.msgs, b.String())
	h.mu.Unlock()
	return nil
}

// Messages returns the records kept so far.
func (h *Logs) Messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.msgs...)
}

// Take returns the records kept so far and forgets them.
func (h *Logs) Take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.msgs
	h.msgs = nil
	return m
}
