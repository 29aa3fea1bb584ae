package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves /metrics, /healthz and /readyz:
//
//   - /metrics: the metrics in Prometheus's text format;
//   - /healthz: 200 "ok" while the process serves HTTP at all (liveness);
//   - /readyz: 200 "ok" when the store is open and ready (on a cluster
//     node: a leader is known, and the node has applied what it had
//     committed), else 503 with the reason in plain text.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := m.Ready(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "fencekv: /metrics /healthz /readyz")
	})
	return mux
}

// readyTimeout bounds how long /readyz waits for a cluster node to catch
// up with what it had committed.
const readyTimeout = 2 * time.Second

// Server is the HTTP server of the endpoints.
type Server struct {
	srv  *http.Server
	addr string
	done chan struct{}
}

// Listen serves the endpoints on addr (host:port) until Close.
func (m *Metrics) Listen(addr string, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http: listen on %s: %w", addr, err)
	}
	s := &Server{
		srv: &http.Server{
			Handler:           m.Handler(),
			ReadHeaderTimeout: 10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       2 * time.Minute,
		},
		addr: ln.Addr().String(),
		done: make(chan struct{}),
	}
	if log != nil {
		s.srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && log != nil {
			log.Error("http server stopped", "err", err)
		}
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.addr }

// Close stops the server, letting requests in progress finish within
// ctx.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		s.srv.Close()
	}
	<-s.done
	return err
}
