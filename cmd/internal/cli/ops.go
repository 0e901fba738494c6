package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/httpapi"
	"github.com/penguinhq/dispatcher/pkg/ingest"
)

// Ops is the operators' listener settings.
type Ops struct {
	Addr            string
	Token           string
	TLSCert, TLSKey string
}

// OpsSettings registers OPS_ADDR, and ADMIN_TOKEN when withAdmin.
func OpsSettings(s *Settings, def string, withAdmin bool) *Ops {
	o := &Ops{}
	s.String(&o.Addr, "OPS_ADDR", def, "address of the operators' listener: /metrics, /healthz, /readyz"+map[bool]string{true: ", the admin API and the console; the standalone dispatcher binds 127.0.0.1:9091 unless this is set", false: ""}[withAdmin])
	s.String(&o.TLSCert, "OPS_TLS_CERT", "", "certificate (PEM) to serve the operators' listener over TLS")
	s.String(&o.TLSKey, "OPS_TLS_KEY", "", "the certificate's private key (PEM)")
	if withAdmin {
		s.Token(&o.Token, "ADMIN_TOKEN", "bearer token of the admin API and the console on OPS_ADDR, at least 32 characters; empty turns both off", false)
	}
	return o
}

// OpsServer is the operators' listener's HTTP server: like Server, with room for long
// admin calls (a replay of many dead letters).
func OpsServer(h http.Handler) *http.Server {
	srv := Server(h)
	srv.WriteTimeout = 5 * time.Minute
	return srv
}

// NewRegistry returns a Prometheus registry with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// OpsHandler serves /metrics from reg, /healthz, /readyz from ready (nil error: ready),
// and mounts admin (if not nil) under /admin/ and console (if not nil) under /console/.
//
// /readyz answers within httpapi.ReadyTimeout whatever NATS does (503 "cannot tell" past
// it); /healthz asks nothing of NATS.
//
// It registers dispatch_ready on reg: 1 while ready says so, read at each scrape within
// the same bound (a scrape during a NATS leader election must not stall on it), for an
// alert on an instance that stays unready (once per registry: the standalone's two parts
// share one).
func OpsHandler(reg *prometheus.Registry, ready func(ctx context.Context) error, admin, console http.Handler, log zerolog.Logger) http.Handler {
	gaugeReady := httpapi.Bounded(ready, httpapi.ReadyTimeout)
	readyGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dispatch_ready",
		Help: "1 while /readyz answers 200 (the queue reachable and taking writes; not starting or stopping), else 0; read at each scrape"},
		func() float64 {
			if gaugeReady(context.Background()) != nil {
				return 0
			}
			return 1
		})
	if err := reg.Register(readyGauge); err != nil && !errors.As(err, &prometheus.AlreadyRegisteredError{}) {
		log.Warn().Err(err).Msg("dispatch_ready is not served")
	}
	r := chi.NewRouter()
	r.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Method(http.MethodGet, "/readyz", httpapi.Ready(ready,
		"not ready: the queue is not reachable or does not take writes, or the service is starting or stopping; its log says which", log))
	if admin != nil {
		r.Mount("/admin", admin)
	}
	if console != nil {
		r.Handle("/console/*", console)
		r.Get("/console", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
		})
	}
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusNotFound, Code: "not_found",
			Detail: fmt.Sprintf("no route %s %s on the operators' listener", r.Method, r.URL.Path)})
	})
	return r
}

// Secure applies the ingest settings' authentication to cfg and ln: the bearer tokens
// (watched for changes until ctx ends) and TLS, mutual when a client CA is given. It
// logs a warning when ingest is left open to anyone.
func (c *Ingest) Secure(ctx context.Context, ln net.Listener, log zerolog.Logger) (net.Listener, error) {
	if c.TokensFile != "" || c.Tokens != "" {
		t, err := ingest.NewTokens(c.TokensFile, strings.Split(c.Tokens, ","))
		if err != nil {
			return nil, fmt.Errorf("INGEST_TOKENS_FILE / INGEST_TOKEN: %w", err)
		}
		c.Config.Tokens = t
		go t.Watch(ctx, 5*time.Second, log)
	} else {
		log.Warn().Msg("ingest accepts requests from anyone: set INGEST_TOKENS_FILE or INGEST_TOKEN to require a bearer token")
	}
	return serveTLS(ln, "INGEST_TLS", c.TLSCert, c.TLSKey, c.ClientCA)
}

// Secure serves the operators' listener over TLS when OPS_TLS_CERT is set.
func (o *Ops) Secure(ln net.Listener) (net.Listener, error) {
	return serveTLS(ln, "OPS_TLS", o.TLSCert, o.TLSKey, "")
}

// Listen opens the operators' listener (OPS_ADDR), over TLS when OPS_TLS_CERT is set.
func (o *Ops) Listen() (net.Listener, error) {
	ln, err := Listen(o.Addr, "OPS_ADDR")
	if err != nil {
		return nil, err
	}
	return o.Secure(ln)
}

// ServeOps serves the operators' handler h on ln until stop is called, not when ctx ends:
// the operators' listener outlives what it watches by that one's drain, so that a scrape
// counts its last requests. stop shuts it down and returns why it ended.
func ServeOps(ctx context.Context, h http.Handler, ln net.Listener) (stop func() error) {
	opsCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- Serve(opsCtx, OpsServer(h), ln, 5*time.Second) }()
	return func() error { cancel(); return <-done }
}

// serveTLS wraps ln in TLS with cert and key (none given: ln as it is), requiring client
// certificates from clientCA when it is given. prefix names the settings in errors.
func serveTLS(ln net.Listener, prefix, certFile, keyFile, clientCA string) (net.Listener, error) {
	if certFile == "" && keyFile == "" && clientCA == "" {
		return ln, nil
	}
	if certFile == "" || keyFile == "" {
		return nil, fmt.Errorf("%s_CERT and %s_KEY: give both (a client CA needs them too)", prefix, prefix)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%s_CERT / %s_KEY: %w", prefix, prefix, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("%s_CLIENT_CA: %w", prefix, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s_CLIENT_CA=%q holds no PEM certificate", prefix, clientCA)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return tlsListener{tls.NewListener(ln, cfg)}, nil
}

// tlsListener marks a listener that serves TLS, for URLFor and LocalURL.
type tlsListener struct{ net.Listener }
