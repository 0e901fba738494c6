package queue_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
)

// connects says whether a connection with these settings gets through, and can open the
// queue: true once it did, false once the connection met an error before it connected
// (the server refused it, or the TLS handshake failed). Neither within 15 s is false
// too, with the wait logged.
func connects(t testing.TB, url string, sec queue.Security, log zerolog.Logger) bool {
	t.Helper()
	nc, err := queue.Connect(url, "test", log, sec)
	if err != nil {
		return false
	}
	defer nc.Close()
	deadline := time.Now().Add(15 * time.Second)
	for !nc.Connected() {
		if err := nc.LastError(); err != nil {
			return false
		}
		if time.Now().After(deadline) {
			t.Logf("neither connected nor refused within 15 s")
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err = nc.Open(ctx, queue.Config{}, queue.CreateOrUpdate); err != nil {
		t.Logf("connected, but opening the queue: %v", err)
		return false
	}
	return true
}

func TestNATSUserPassword(t *testing.T) {
	t.Parallel()
	s := queuetest.ServerWith(t, t.TempDir(), "127.0.0.1:0", func(o *server.Options) {
		o.Users = []*server.User{{Username: "ingest", Password: "s3cret-pw"}}
	})
	port := s.Addr().String()[strings.LastIndexByte(s.Addr().String(), ':'):]
	var logs bytes.Buffer
	log := zerolog.New(&logs)
	if !connects(t, "nats://ingest:s3cret-pw@127.0.0.1"+port, queue.Security{}, log) {
		t.Fatal("the right password did not get in")
	}
	if connects(t, "nats://ingest:wrong-pw@127.0.0.1"+port, queue.Security{}, log) {
		t.Fatal("a wrong password got in")
	}
	if connects(t, "nats://127.0.0.1"+port, queue.Security{}, log) {
		t.Fatal("no password got in")
	}
	if strings.Contains(logs.String(), "s3cret-pw") || strings.Contains(logs.String(), "wrong-pw") {
		t.Fatalf("a password was logged:\n%s", &logs)
	}
	if got := queue.RedactURLs("nats://ingest:s3cret-pw@n1:4222,nats://ingest:s3cret-pw@n2:4222"); strings.Contains(got, "s3cret") {
		t.Fatalf("RedactURLs left the password in: %s", got)
	}
}

func TestNATSNKey(t *testing.T) {
	t.Parallel()
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	otherFile := filepath.Join(t.TempDir(), "other.nk")
	if err := os.WriteFile(otherFile, otherSeed, 0o600); err != nil {
		t.Fatal(err)
	}
	s := queuetest.ServerWith(t, t.TempDir(), "127.0.0.1:0", func(o *server.Options) {
		o.Nkeys = []*server.NkeyUser{{Nkey: pub}}
	})
	if !connects(t, s.ClientURL(), queue.Security{NKeySeedFile: seedFile}, zerolog.Nop()) {
		t.Fatal("the right NKey did not get in")
	}
	if connects(t, s.ClientURL(), queue.Security{NKeySeedFile: otherFile}, zerolog.Nop()) {
		t.Fatal("an unknown NKey got in")
	}
	if _, err := queue.Connect(s.ClientURL(), "test", zerolog.Nop(), queue.Security{NKeySeedFile: "/nonexistent/seed"}); err == nil || !strings.Contains(err.Error(), "NATS_NKEY_SEED_FILE") {
		t.Fatalf("a missing seed file: %v, want an error naming NATS_NKEY_SEED_FILE", err)
	}
}

// TLS with real certificates: the server verifies clients; a client must trust the
// server's CA and present a certificate from it.
func TestNATSMutualTLS(t *testing.T) {
	t.Parallel()
	pki := queuetest.NewPKI(t)
	s := queuetest.ServerWith(t, t.TempDir(), "127.0.0.1:0", func(o *server.Options) {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: pki.ServerCert, KeyFile: pki.ServerKey, CaFile: pki.CA, Verify: true})
		if err != nil {
			t.Fatal(err)
		}
		o.TLSConfig, o.TLS, o.TLSVerify = tc, true, true
	})
	url := "tls://" + s.Addr().String()
	good := queue.Security{CAFile: pki.CA, CertFile: pki.ClientCert, KeyFile: pki.ClientKey}
	if !connects(t, url, good, zerolog.Nop()) {
		t.Fatal("a client with the CA and a client certificate did not get in")
	}
	if connects(t, url, queue.Security{CAFile: pki.CA}, zerolog.Nop()) {
		t.Fatal("a client without a certificate got in")
	}
	if connects(t, url, queue.Security{CAFile: pki.Other, CertFile: pki.ClientCert, KeyFile: pki.ClientKey}, zerolog.Nop()) {
		t.Fatal("a client that does not trust the server's CA connected")
	}
	if connects(t, "nats://"+s.Addr().String(), queue.Security{}, zerolog.Nop()) {
		t.Fatal("a plain-text client got in")
	}
	if _, err := queue.Connect(url, "test", zerolog.Nop(), queue.Security{CertFile: pki.ClientCert}); err == nil {
		t.Fatal("a certificate without its key was accepted as a setting")
	}
}

// A tool's connection says why it could not connect, at once: wrong credentials are a
// refusal naming the user (not a closed connection), and no server listening is
// "cannot reach", tried once per server (not retried until the command's timeout).
func TestConnectOnceSaysWhy(t *testing.T) {
	t.Parallel()
	s := queuetest.ServerWith(t, t.TempDir(), "127.0.0.1:0", func(o *server.Options) {
		o.Users = []*server.User{{Username: "ops", Password: "ops-pw"}}
	})
	url := "nats://" + s.Addr().String()
	nc, err := queue.ConnectOnce(url, "test", 10*time.Second, queue.Security{User: "ops", Password: "ops-pw"})
	if err != nil {
		t.Fatalf("the right password: %v", err)
	}
	nc.Close()

	_, err = queue.ConnectOnce(url, "test", 10*time.Second, queue.Security{User: "ops", Password: "wrong-pw"})
	if !errors.Is(err, queue.ErrRefused) || !strings.Contains(err.Error(), `user "ops"`) || strings.Contains(err.Error(), "wrong-pw") {
		t.Fatalf("a wrong password: %v, want a refusal naming the user and not the password", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "nats://" + ln.Addr().String()
	ln.Close()
	_, err = queue.ConnectOnce(closed+","+closed, "test", 10*time.Second, queue.Security{})
	if !errors.Is(err, queue.ErrUnreachable) || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("nothing listening: %v, want cannot reach NATS at the address", err)
	}
}

// With one server of the list down and another refusing the password, the refusal is
// what the operator hears, whichever server nats.go tried last.
func TestConnectOnceReportsARefusalBeforeADownServer(t *testing.T) {
	t.Parallel()
	s := queuetest.ServerWith(t, t.TempDir(), "127.0.0.1:0", func(o *server.Options) {
		o.Users = []*server.User{{Username: "ops", Password: "ops-pw"}}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "nats://" + ln.Addr().String()
	ln.Close()
	for _, url := range []string{down + ",nats://" + s.Addr().String(), "nats://" + s.Addr().String() + "," + down} {
		if _, err := queue.ConnectOnce(url, "test", 10*time.Second, queue.Security{User: "ops", Password: "wrong"}); !errors.Is(err, queue.ErrRefused) {
			t.Errorf("%s: %v, want a refusal", url, err)
		}
	}
}
