package natsnode

import (
	"fmt"
	"net"
	"slices"
	"strconv"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/queue"
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
	// Users, when not empty, are the only users the server takes: each role's user (named
	// as the role) with this password and that role's permissions
	// (queue.RolePermissions). Empty: no authentication.
	Users map[queue.Role]string
	// Configure, if not nil, changes the server options last (tests use it for users and
	// TLS).
	Configure func(*server.Options)
}

// serverPermissions is p as the server's options take it.
func serverPermissions(p queue.Permissions) *server.Permissions {
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: slices.Clone(p.Publish)},
		Subscribe: &server.SubjectPermission{Allow: slices.Clone(p.Subscribe)},
	}
	if len(p.Publish) == 0 {
		sp.Publish = &server.SubjectPermission{Deny: []string{">"}}
	}
	if len(p.Subscribe) == 0 {
		sp.Subscribe = &server.SubjectPermission{Deny: []string{">"}}
	}
	if p.Responses {
		sp.Response = &server.ResponsePermission{MaxMsgs: server.DEFAULT_ALLOW_RESPONSE_MAX_MSGS, Expires: server.DEFAULT_ALLOW_RESPONSE_EXPIRATION}
	}
	return sp
}

// StartEmbedded starts a single-node JetStream server and waits until it accepts
// connections. Shut it down with Shutdown; run its Guard to have it recover by itself
// from a full disk.
func StartEmbedded(cfg EmbeddedConfig, log zerolog.Logger) (*Node, error) {
	if cfg.StoreDir == "" {
		return nil, fmt.Errorf("embedded nats: store dir is required")
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = 8 << 20
	}
	var host string
	port := -1
	if cfg.Listen != "" {
		h, p, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: listen address %q: %w", cfg.Listen, err)
		}
		if port, err = strconv.Atoi(p); err != nil {
			return nil, fmt.Errorf("embedded nats: listen port %q: %w", p, err)
		}
		host = h
		if host == "" {
			host = "0.0.0.0"
		}
	}
	options := func() (*server.Options, error) {
		opts := &server.Options{
			ServerName: "dispatcher-embedded",
			JetStream:  true,
			StoreDir:   cfg.StoreDir,
			MaxPayload: cfg.MaxPayload,
			NoLog:      true,
			NoSigs:     true,
			SyncAlways: cfg.SyncAlways,
			DontListen: cfg.Listen == "",
			Host:       host,
			Port:       port,
		}
		for _, r := range queue.Roles {
			if pw, ok := cfg.Users[r]; ok {
				opts.Users = append(opts.Users, &server.User{Username: string(r), Password: pw, Permissions: serverPermissions(queue.RolePermissions(r))})
			}
		}
		if cfg.Configure != nil {
			cfg.Configure(opts)
		}
		return opts, nil
	}
	n, err := StartNode(options, nil, log)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	return n, nil
}
