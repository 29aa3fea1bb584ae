package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/metrics"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

func serveCommand() *cli.Command {
	d := fencekv.DefaultOptions()
	w := wire.DefaultConfig()
	env := func(name string) []string { return []string{"FENCEKV_" + name} }
	return &cli.Command{
		Name:  "serve",
		Usage: "run the fencekv server",
		UsageText: `fencekv serve [--data DIR] [--listen ADDR] [limits...]

Serves the MessagePack-RPC protocol (wire/PROTOCOL.md) on --listen, with its
data in --data. Every flag can also be set with the FENCEKV_* variable shown.
SIGINT or SIGTERM shut down gracefully (in-flight requests are answered,
exit status 0); a second signal exits at once.

Example:
  fencekv serve --data /var/lib/fencekv --listen 127.0.0.1:7420 --log-format json`,
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "data", Value: "./fencekv-data", EnvVars: env("DATA"), Usage: "data `DIR` (created if missing; one server per dir)"},
			&cli.StringFlag{Name: "listen", Value: DefaultAddr, EnvVars: env("LISTEN"), Usage: "TCP `ADDRESS` to serve on"},
			&cli.IntFlag{Name: "max-message-size", Value: w.MaxMessageSize, EnvVars: env("MAX_MESSAGE_SIZE"), Usage: "largest request in bytes (at least --max-value-size plus twice --max-key-size plus 256: a put of the largest value must fit)"},
			&cli.IntFlag{Name: "max-key-size", Value: d.MaxKeySize, EnvVars: env("MAX_KEY_SIZE"), Usage: "largest key, lock name or holder in bytes"},
			&cli.IntFlag{Name: "max-value-size", Value: d.MaxValueSize, EnvVars: env("MAX_VALUE_SIZE"), Usage: "largest value in bytes (must fit in --max-message-size, with its key)"},
			&cli.IntFlag{Name: "max-conns", Value: w.MaxConns, EnvVars: env("MAX_CONNS"), Usage: "most client connections at once"},
			&cli.IntFlag{Name: "max-in-flight", Value: w.MaxInFlight, EnvVars: env("MAX_IN_FLIGHT"), Usage: "most pending requests per connection"},
			&cli.IntFlag{Name: "max-pending-bytes", Value: w.MaxPendingBytes, EnvVars: env("MAX_PENDING_BYTES"), Usage: "bytes per connection of unsent answers and of the values of its writes in flight, past which its requests are not read until the client reads its answers or the writes are applied"},
			&cli.DurationFlag{Name: "read-timeout", Value: w.ReadTimeout, EnvVars: env("READ_TIMEOUT"), Usage: "close a connection whose message has begun to arrive and is not whole this long after (a half-sent message no longer holds a connection); 0 turns it off; idle connections have no timeout"},
			&cli.IntFlag{Name: "max-watches", Value: w.MaxWatches, EnvVars: env("MAX_WATCHES"), Usage: "most watches per connection"},
			&cli.IntFlag{Name: "max-watchers", Value: d.MaxWatchers, EnvVars: env("MAX_WATCHERS"), Usage: "most watches at once, store-wide"},
			&cli.IntFlag{Name: "watch-history", Value: d.WatchHistory, EnvVars: env("WATCH_HISTORY"), Usage: "events kept, in the data file, for watches to resume from (across restarts too); a start before them is compacted"},
			&cli.IntFlag{Name: "watch-history-bytes", Value: d.WatchHistoryBytes, EnvVars: env("WATCH_HISTORY_BYTES"), Usage: "bound on the keys and values of the kept watch history"},
			&cli.BoolFlag{Name: "event-loop", Value: w.EventLoop, EnvVars: env("EVENT_LOOP"), Usage: "serve plain TCP connections of a single node from one epoll event loop (Linux); false: a goroutine per connection"},
			&cli.IntFlag{Name: "max-waiters", Value: d.MaxWaiters, EnvVars: env("MAX_WAITERS"), Usage: "most callers queued for locks"},
			&cli.DurationFlag{Name: "min-ttl", Value: d.MinTTL, EnvVars: env("MIN_TTL"), Usage: "shortest lease"},
			&cli.DurationFlag{Name: "max-ttl", Value: d.MaxTTL, EnvVars: env("MAX_TTL"), Usage: "longest lease"},
			&cli.DurationFlag{Name: "shutdown-timeout", Value: 10 * time.Second, EnvVars: env("SHUTDOWN_TIMEOUT"), Usage: "how long a graceful shutdown waits for in-flight requests"},
			&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: env("LOG_LEVEL"), Usage: "debug, info, warn or error"},
			&cli.StringFlag{Name: "log-format", Value: "text", EnvVars: env("LOG_FORMAT"), Usage: "text or json"},
			&cli.StringFlag{Name: "cpu-profile", Usage: "write a CPU profile to `FILE` until shutdown (for performance work)"},
			&cli.StringFlag{Name: "http", Value: DefaultHTTPAddr, EnvVars: env("HTTP"), Usage: "serve /metrics, /healthz and /readyz over HTTP on `ADDRESS` (\"\" turns it off; each server on a machine needs its own)"},
		}, append(clusterFlags(), serveSecurityFlags()...)...),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			log, err := newLogger(c.App.ErrWriter, c.String("log-level"), c.String("log-format"))
			if err != nil {
				return usageError{err}
			}
			o := fencekv.DefaultOptions()
			o.Logger = log
			o.MaxKeySize = c.Int("max-key-size")
			o.MaxValueSize = c.Int("max-value-size")
			o.MaxWaiters = c.Int("max-waiters")
			o.MaxWatchers = c.Int("max-watchers")
			o.WatchHistory = c.Int("watch-history")
			o.WatchHistoryBytes = c.Int("watch-history-bytes")
			o.MinTTL = c.Duration("min-ttl")
			o.MaxTTL = c.Duration("max-ttl")
			wc := wire.DefaultConfig()
			wc.Logger = log
			wc.MaxMessageSize = c.Int("max-message-size")
			wc.MaxConns = c.Int("max-conns")
			wc.MaxInFlight = c.Int("max-in-flight")
			wc.MaxPendingBytes = c.Int("max-pending-bytes")
			wc.MaxWatches = c.Int("max-watches")
			wc.EventLoop = c.Bool("event-loop")
			wc.ReadTimeout = c.Duration("read-timeout")
			if wc.ReadTimeout < 0 {
				return usagef("--read-timeout %v: want a duration of 0 (none) or more", wc.ReadTimeout)
			}
			if err := valueFits(o, wc); err != nil {
				return err
			}
			// TLS and auth (security.go).
			sec, err := serverSecurityOf(c, c.String("node") != "")
			if err != nil {
				return err
			}
			sec.configure(&wc, log)
			defer sec.reloadOnHangup(log, c.String("node") != "")()

			// Each connection takes a file descriptor: allow as many as
			// the system lets this process have. Past that, new clients
			// are told limit_exceeded (wire/PROTOCOL.md §2.4).
			if n, err := raiseFileLimit(); err != nil {
				log.Warn("could not raise the file descriptor limit", "fd_limit", n, "err", err)
			} else {
				log.Info("file descriptor limit", "fd_limit", n, "max_conns", wc.MaxConns)
			}

			stopProfile, err := startCPUProfile(c.String("cpu-profile"))
			if err != nil {
				return err
			}
			defer stopProfile()
			ctx, stop := shutdownSignals(c.Context, log)
			defer stop()
			// The HTTP endpoints come up first, so that /readyz can say the
			// store is still opening.
			ops := metrics.New()
			o.Observer = ops
			wc.Observe = ops.Observe
			if addr := c.String("http"); addr != "" {
				hs, err := ops.Listen(addr, log)
				if err != nil {
					return fmt.Errorf("--http: %w (each server on a machine needs its own --http address; --http \"\" turns it off)", err)
				}
				defer func() {
					sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					hs.Close(sctx)
				}()
				log.Info("http endpoints", "addr", hs.Addr(), "paths", "/metrics /healthz /readyz")
			}
			open := func(clientAddr string) (engine, error) { return openEngine(c, c.String("data"), clientAddr, o, sec) }
			return serve(ctx, log, open, c.String("data"), c.String("listen"), wc, c.Duration("shutdown-timeout"), nil, ops)
		},
	}
}

// messageOverhead is what a put's message carries besides its value, key
// and lock name: the envelope, the method, the field names, the token and
// the headers of the byte strings.
const messageOverhead = 256

// valueFits refuses a value limit that the message limit does not leave
// room for: a put of the largest value, with the longest key and lock
// name, must fit in one message, or values the store accepts could never
// be sent (the server would answer them too_large).
func valueFits(o fencekv.Options, wc wire.Config) error {
	need := o.MaxValueSize + 2*o.MaxKeySize + messageOverhead
	if need <= wc.MaxMessageSize {
		return nil
	}
	return usagef("--max-value-size %d does not fit in --max-message-size %d: a put also carries its key and lock name (up to --max-key-size %d each) and %d bytes of framing; raise --max-message-size to at least %d, or lower --max-value-size to at most %d",
		o.MaxValueSize, wc.MaxMessageSize, o.MaxKeySize, messageOverhead, need, max(wc.MaxMessageSize-2*o.MaxKeySize-messageOverhead, 0))
}

// shutdownSignals returns a context cancelled by the first SIGINT or
// SIGTERM; a second one exits the process at once.
func shutdownSignals(parent context.Context, log *slog.Logger) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			log.Info("shutting down", "signal", s.String())
			cancel()
		case <-done:
			return
		}
		select {
		case s := <-sigs:
			log.Warn("second signal: exiting now", "signal", s.String())
			os.Exit(1)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	}
}

// serve runs a server until ctx ends, then shuts it down gracefully. It
// listens first, so a server that cannot bind leaves no data dir behind;
// open then opens the engine for the address it listens on. If ready is
// not nil, it receives the listening address once serving.
// ops, if not nil, is told when the store is serving and when it stops.
func serve(ctx context.Context, log *slog.Logger, open func(clientAddr string) (engine, error), dir, listen string, wc wire.Config, grace time.Duration, ready chan<- string, ops *metrics.Metrics) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", listen, err)
	}
	eng, err := open(ln.Addr().String())
	if err != nil {
		ln.Close()
		return err
	}
	srv, err := wire.NewServer(eng, wc)
	if err != nil {
		ln.Close()
		eng.Close()
		return usageError{err}
	}
	st, err := eng.Status(ctx)
	if err != nil {
		ln.Close()
		eng.Close()
		return err
	}
	log.Info("fencekv serving", "version", fencekv.Version, "data", dir, "addr", ln.Addr().String(), "role", st.Role,
		"tokens_issued", uint64(st.LastToken), "keys", st.Keys, "locks", st.Locks)
	if ops != nil {
		ops.Attach(eng, srv)
	}
	if ready != nil {
		ready <- ln.Addr().String()
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
	case err := <-served:
		if ops != nil {
			ops.Detach("the server stopped: " + err.Error())
		}
		eng.Close()
		return fmt.Errorf("serving: %w", err)
	}
	if ops != nil {
		ops.Detach("the server is shutting down")
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	serr := srv.Shutdown(sctx)
	<-served
	if serr != nil {
		log.Warn("shutdown deadline passed; closed remaining connections", "err", serr)
	}
	st, _ = eng.Status(context.Background())
	if err := eng.Close(); err != nil {
		return fmt.Errorf("closing the data file: %w", err)
	}
	log.Info("fencekv stopped", "tokens_issued", uint64(st.LastToken), "revision", uint64(st.Revision))
	return nil
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	ho := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	case "json":
		// Durations as text ("300ms"), as in the text format: JSON's
		// default is an integer of nanoseconds with no unit in its name.
		ho.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			return a
		}
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// startCPUProfile writes a CPU profile to path (if not empty) until the
// returned function is called.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	out, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		out.Close()
	}, nil
}
