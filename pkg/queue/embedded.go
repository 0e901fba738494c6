package queue

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedConfig configures an in-process nats-server with JetStream.
type EmbeddedConfig struct {
	// StoreDir is where JetStream keeps its files. Required.
	StoreDir string
	// Listen is host:port for NATS clients outside the process; empty means in-process
	// connections only. Defaults to empty.
	Listen string
	// SyncAlways makes the server fsync every write before it acknowledges, so an
	// acknowledged request survives power loss. Defaults to false here; the standalone
	// binary turns it on.
	SyncAlways bool
	// MaxPayload is the largest message the server takes. Defaults to 8 MiB.
	MaxPayload int32
	// Configure, if not nil, changes the server options last (tests use it for users and
	// TLS).
	Configure func(*server.Options)
}

// StartEmbedded starts a single-node JetStream server and waits until it accepts
// connections. Shut it down with Shutdown and WaitForShutdown.
func StartEmbedded(cfg EmbeddedConfig) (*server.Server, error) {
	if cfg.StoreDir == "" {
		return nil, fmt.Errorf("embedded nats: store dir is required")
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = 8 << 20
	}
	opts := &server.Options{
		ServerName: "dispatcher-embedded",
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		MaxPayload: cfg.MaxPayload,
		NoLog:      true,
		NoSigs:     true,
		SyncAlways: cfg.SyncAlways,
		DontListen: cfg.Listen == "",
	}
	if cfg.Listen != "" {
		host, port, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: listen address %q: %w", cfg.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: listen port %q: %w", port, err)
		}
		if host == "" {
			host = "0.0.0.0"
		}
		opts.Host, opts.Port = host, p
	}
	if cfg.Configure != nil {
		cfg.Configure(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats: not ready within 30s (store dir %s)", cfg.StoreDir)
	}
	return s, nil
}
