package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/record"
	"github.com/penguinhq/dispatcher/pkg/retry"
)

// OpenQueue opens the queue, trying again every second while NATS is not there yet, until
// ctx ends.
func OpenQueue(ctx context.Context, nc *queue.Conn, cfg queue.Config, ensure queue.Ensure, log zerolog.Logger) (*queue.Queue, error) {
	return Retry(ctx, log, "opening queue", func(ctx context.Context) (*queue.Queue, error) {
		return nc.Open(ctx, cfg, ensure)
	})
}

// StartEvents starts the writer of requests' events, named instance in them. stop
// ends it, after it wrote what was waiting (up to 5s): call it once nothing records
// events any more, and before the connection closes.
func StartEvents(q *queue.Queue, instance string, reg prometheus.Registerer, log zerolog.Logger) (w *record.Writer, stop func()) {
	w = q.NewEventWriter(instance, 0, reg, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx, 5*time.Second) }()
	return w, func() { cancel(); <-done }
}

// Retry calls open, each call bounded to 10s, until it succeeds, fails for a reason that
// is not transient (a wrong setting), or ctx ends. A cluster still electing leaders, or
// NATS not started yet, is transient.
func Retry[T any](ctx context.Context, log zerolog.Logger, what string, open func(context.Context) (T, error)) (T, error) {
	began := time.Now()
	var v T
	p := retry.Policy{First: time.Second, OnFail: func(_ int, err error, _ time.Duration) {
		// A cluster starting with its services elects leaders for some seconds: that is
		// no cause for a warning yet.
		ev := log.Info()
		if time.Since(began) > startPatience {
			ev = log.Warn()
		}
		ev.Err(err).Msg(what + ": not reachable yet; retrying")
	}}
	_, err := retry.Do(ctx, p, func(ctx context.Context) error {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var err error
		if v, err = open(octx); err == nil {
			return nil
		}
		// Too few nodes for the replicas asked for: a cluster still forming, or a wrong
		// STREAM_REPLICAS; after a while, the latter.
		// Streams not created yet (a service that may not create them, started before any
		// dispatcher) are as transient as a server still starting.
		noPeers := queue.IsNoPeers(err)
		transient := queue.IsTransient(err) || errors.Is(err, queue.ErrStreamsMissing)
		if ctx.Err() != nil || (!noPeers && !transient) || (noPeers && time.Since(began) > noPeersPatience) {
			return retry.Final(fmt.Errorf("%s: %w", what, err))
		}
		return err
	})
	return v, err
}

// startPatience is how long NATS not answering yet is taken for a cluster starting (and
// logged at info), before it is warned about.
const startPatience = 30 * time.Second

// noPeersPatience is how long "no suitable peers" is taken for a cluster still forming.
const noPeersPatience = 2 * time.Minute

// FitBody lowers limit to what one NATS message can carry beside a request's headers, and
// says so in the log when it had to.
func FitBody(limit int64, nc *queue.Conn, log zerolog.Logger) int64 {
	if max := nc.MaxPayload() - ingest.HeaderRoom; max > 0 && limit > max {
		log.Warn().Int64("max_body_bytes", limit).Int64("nats_max_payload", nc.MaxPayload()).Int64("using", max).
			Msg("MAX_BODY_BYTES does not fit the NATS server's max_payload; lowering it")
		return max
	}
	return limit
}

// Server is an HTTP server with the timeouts a public endpoint needs.
func Server(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}

// Listen opens addr, naming the setting in the error.
func Listen(addr, setting string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: cannot listen: %w", setting, addr, err)
	}
	return ln, nil
}

// Serve serves srv on ln until ctx ends, then shuts it down, giving requests in progress
// up to grace to finish.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// SafeURL is u for logs and errors: its scheme, host and path, never its user,
// password, query or fragment. Of a URL that cannot be read, or whose host cannot be
// told apart from a password (an @ outside its user part), it shows the scheme alone.
func SafeURL(u string) string {
	v := strings.TrimSpace(u)
	if p, err := url.Parse(v); err == nil && (p.User != nil || !strings.Contains(v, "@")) {
		return p.Scheme + "://" + p.Host + p.Path
	}
	if scheme, _, ok := strings.Cut(v, "://"); ok {
		if p, err := url.Parse(scheme + ":"); err == nil && p.Scheme != "" && strings.EqualFold(p.Scheme, scheme) {
			return p.Scheme + "://(the rest hidden: it cannot be read as a URL)"
		}
	}
	return "(a URL that cannot be read, hidden)"
}

// URLFor is the URL of what ln serves at path, with the address ln actually bound: for
// logs, which must say where a service listens. A listener on every interface shows as
// such (http://[::]:8080/, http://0.0.0.0:8080/), never as loopback.
func URLFor(ln net.Listener, path string) string {
	return urlFor(ln, ln.Addr().(*net.TCPAddr).IP.String(), path)
}

// LocalURL is the URL at which a client on this host reaches what ln serves at path: the
// bound address, or loopback for a listener on every interface. For a part of this
// process that calls another (the standalone dispatcher and its demo raven).
func LocalURL(ln net.Listener, path string) string {
	ip := ln.Addr().(*net.TCPAddr).IP
	if ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return urlFor(ln, ip.String(), path)
}

func urlFor(ln net.Listener, host, path string) string {
	scheme := "http://"
	if _, ok := ln.(tlsListener); ok {
		scheme = "https://"
	}
	return scheme + net.JoinHostPort(host, fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)) + path
}

// Main runs a service binary: run gets a context that ends on SIGINT or SIGTERM (the
// graceful stop), and an error from it ends the process with status 2 after printing it
// (-h prints the usage and nothing more).
func Main(name string, run func(ctx context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, name+":", err)
		}
		os.Exit(2)
	}
}
