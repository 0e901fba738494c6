// Package queuetest starts real, embedded NATS servers for tests. Nothing here is a mock:
// each server is a nats-server with JetStream on loopback, its files in a test temp dir.
package queuetest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/freeport"
	"github.com/penguinhq/dispatcher/pkg/natsnode"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Server starts a single-node JetStream server listening on a free loopback port and
// stops it when the test ends.
func Server(t testing.TB) *server.Server {
	t.Helper()
	return ServerAt(t, t.TempDir(), "127.0.0.1:0")
}

// ServerAt starts a server storing under dir and listening on listen ("host:port"; port 0
// picks a free one). Restarting on the same dir and port finds the same data.
func ServerAt(t testing.TB, dir, listen string) *server.Server {
	t.Helper()
	return ServerWith(t, dir, listen, nil)
}

// NodeAt is ServerAt's node: its Shutdown stops the server and lets its store directory
// go, for a test to start another on it (stopping the server alone lets it go a moment
// after).
func NodeAt(t testing.TB, dir, listen string) *natsnode.Node {
	t.Helper()
	return start(t, dir, listen, nil)
}

// ServerWith is ServerAt with the server options changed by configure (users, TLS).
func ServerWith(t testing.TB, dir, listen string, configure func(*server.Options)) *server.Server {
	t.Helper()
	return start(t, dir, listen, configure).Server()
}

// GuardedServerAt is ServerAt with the store guard running, as the standalone binary
// runs it: JetStream comes back by itself after the store's file system was full.
func GuardedServerAt(t testing.TB, dir, listen string) *natsnode.Node {
	t.Helper()
	e := start(t, dir, listen, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.Guard.Run(ctx, 100*time.Millisecond) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

func start(t testing.TB, dir, listen string, configure func(*server.Options)) *natsnode.Node {
	t.Helper()
	if listen == "127.0.0.1:0" {
		// A port below the ephemeral range: a restarted server binds its port again, and
		// one from the range may have gone to a connection meanwhile (package freeport).
		addr, err := freeport.Loopback()
		if err != nil {
			t.Fatal(err)
		}
		listen = addr
	}
	s, err := natsnode.StartEmbedded(natsnode.EmbeddedConfig{StoreDir: dir, Listen: listen, Configure: configure}, zerolog.Nop())
	if err != nil {
		t.Fatalf("starting embedded nats: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// DialTimeout bounds a test's dial to its own server: nats.go's default of 2 s is
// too short on a machine that runs two CI runs at once (a dial timed out there).
const DialTimeout = 30 * time.Second

// Conn connects to s and closes the connection when the test ends.
func Conn(t testing.TB, s *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.Timeout(DialTimeout))
	if err != nil {
		t.Fatalf("connecting to %s: %v", s.ClientURL(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Open is queue.Open as the binaries call it on a cluster: a placement refused for want of
// peers, or another transient error, is tried again (every 100 ms) until ctx ends. On a
// loaded machine a cluster that had every peer a moment ago can count one offline for a
// while (its statistics came late), and a stream's creation then fails at once.
func Open(ctx context.Context, nc *nats.Conn, cfg queue.Config, ensure queue.Ensure) (*queue.Queue, error) {
	for {
		q, err := queue.Open(ctx, nc, cfg, ensure)
		if err == nil || (!queue.IsNoPeers(err) && !queue.IsTransient(err)) || ctx.Err() != nil {
			return q, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// KeptOutcomes counts the final events kept in the request stream (queue.KeepOutcome)
// and not yet drained.
func KeptOutcomes(t testing.TB, nc *nats.Conn) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, queue.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(request.OutcomePrefix+">"))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}
