package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/cmd/internal/cli"
	"github.com/penguinhq/dispatcher/pkg/ingest"
)

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestSettings(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string // substrings the error must hold; nil for success
		check   func(t *testing.T, c *settings)
	}{
		{name: "Defaults", args: []string{"-standalone"}, check: func(t *testing.T, c *settings) {
			if c.dispatch.Interval != 5*time.Second || c.dataDir != "./data" || c.ingest.MaxBodyBytes != 1<<20-4<<10 || c.natsSync != "always" {
				t.Fatalf("defaults: interval %s, data %s, body %d, sync %s", c.dispatch.Interval, c.dataDir, c.ingest.MaxBodyBytes, c.natsSync)
			}
		}},
		// The standalone is private unless asked otherwise: its listeners bind loopback
		// by default, and an address given opens one.
		{name: "StandaloneListensOnLoopback", args: []string{"-standalone"}, check: func(t *testing.T, c *settings) {
			if c.ingest.Addr != "127.0.0.1:8080" || c.ops.Addr != "127.0.0.1:9091" || c.demoAddr != "127.0.0.1:8081" || c.natsListen != "" {
				t.Fatalf("standalone listens on ingest %q, ops %q, demo raven %q, NATS %q; want loopback only", c.ingest.Addr, c.ops.Addr, c.demoAddr, c.natsListen)
			}
		}},
		{name: "StandaloneAddressesGiven", args: []string{"-standalone", "-ops-addr", ":9091"}, env: map[string]string{"INGEST_ADDR": ":8080"}, check: func(t *testing.T, c *settings) {
			if c.ingest.Addr != ":8080" || c.ops.Addr != ":9091" {
				t.Fatalf("ingest %q, ops %q; want the addresses given", c.ingest.Addr, c.ops.Addr)
			}
		}},
		// NATS_LISTEN without users: loopback only, unless asked for by name (issue 35,
		// finding 8); with a password, the embedded server has that role's user.
		{name: "NATSListenOpenRefused", args: []string{"-standalone"}, env: map[string]string{"NATS_LISTEN": ":4222"},
			wantErr: []string{"NATS_LISTEN=:4222", "without authentication", "INGEST_NATS_PASSWORD", "NATS_LISTEN_NO_AUTH=true"}},
		{name: "NATSListenAnyIPRefused", args: []string{"-standalone"}, env: map[string]string{"NATS_LISTEN": "0.0.0.0:4222"},
			wantErr: []string{"NATS_LISTEN=0.0.0.0:4222"}},
		{name: "NATSListenOpenAskedFor", args: []string{"-standalone"}, env: map[string]string{"NATS_LISTEN": ":4222", "NATS_LISTEN_NO_AUTH": "true"}, check: func(t *testing.T, c *settings) {}},
		{name: "NATSListenLoopback", args: []string{"-standalone"}, env: map[string]string{"NATS_LISTEN": "127.0.0.1:4222"}, check: func(t *testing.T, c *settings) {
			if c.listenUsers != nil {
				t.Fatalf("users %v without a password given", c.listenUsers)
			}
		}},
		{name: "NATSListenWithUsers", args: []string{"-standalone"}, env: map[string]string{"NATS_LISTEN": ":4222", "OPS_NATS_PASSWORD": "pw-o"}, check: func(t *testing.T, c *settings) {
			if len(c.listenUsers) != 1 || c.listenUsers["ops"] != "pw-o" {
				t.Fatalf("users %v, want ops alone", c.listenUsers)
			}
		}},
		{name: "DispatcherListensEverywhere", env: map[string]string{"RAVEN_URL": "http://raven:8081/"}, check: func(t *testing.T, c *settings) {
			if c.ops.Addr != ":9091" {
				t.Fatalf("ops %q; want a container's :9091", c.ops.Addr)
			}
		}},
		{name: "EnvIsRead", env: map[string]string{"STANDALONE": "true", "DISPATCH_INTERVAL": "250ms", "PARTITIONS": "8", "MAX_ATTEMPTS": "3"}, check: func(t *testing.T, c *settings) {
			if !c.standalone || c.dispatch.Interval != 250*time.Millisecond || c.queue.Partitions != 8 || c.dispatch.MaxAttempts != 3 {
				t.Fatalf("env not applied: %+v %+v", c.dispatch.Config, c.queue)
			}
		}},
		{name: "FlagWinsOverEnv", args: []string{"-standalone", "-dispatch-interval", "2s"}, env: map[string]string{"DISPATCH_INTERVAL": "not-a-duration"}, check: func(t *testing.T, c *settings) {
			if c.dispatch.Interval != 2*time.Second {
				t.Fatalf("interval %s, want the flag's 2s", c.dispatch.Interval)
			}
		}},
		{name: "ErrIntervalUnparsable", env: map[string]string{"STANDALONE": "1", "DISPATCH_INTERVAL": "five"}, wantErr: []string{"DISPATCH_INTERVAL", "duration"}},
		{name: "ErrIntervalNegative", args: []string{"-standalone", "-dispatch-interval", "-1s"}, wantErr: []string{"-dispatch-interval", "at least"}},
		{name: "ErrLogFormat", env: map[string]string{"STANDALONE": "1", "LOG_FORMAT": "xml"}, wantErr: []string{"LOG_FORMAT", "json, console, auto"}},
		{name: "ErrLogLevel", env: map[string]string{"STANDALONE": "1", "LOG_LEVEL": "loud"}, wantErr: []string{"LOG_LEVEL", "debug"}},
		{name: "ErrNATSURL", env: map[string]string{"STANDALONE": "1", "NATS_URL": "localhost"}, wantErr: []string{"NATS_URL", "nats"}},
		{name: "ErrRavenURL", env: map[string]string{"RAVEN_URL": "ftp://x"}, wantErr: []string{"RAVEN_URL", "http"}},
		{name: "ErrRavenURLMissing", wantErr: []string{"RAVEN_URL is required", "-standalone"}},
		{name: "ErrPartitions", env: map[string]string{"STANDALONE": "1", "PARTITIONS": "0"}, wantErr: []string{"PARTITIONS", "1 to 1024"}},
		{name: "ErrBodyLimit", env: map[string]string{"STANDALONE": "1", "MAX_BODY_BYTES": "1MB"}, wantErr: []string{"MAX_BODY_BYTES", "whole number"}},
		{name: "ErrNatsSync", env: map[string]string{"STANDALONE": "1", "NATS_SYNC": "never"}, wantErr: []string{"NATS_SYNC", "always, interval"}},
		{name: "ErrInstanceID", env: map[string]string{"STANDALONE": "1", "INSTANCE_ID": "a.b c"}, wantErr: []string{"INSTANCE_ID", "letters"}},
		{name: "ErrLeaseTTL", env: map[string]string{"STANDALONE": "1", "LEASE_TTL": "1ms"}, wantErr: []string{"LEASE_TTL", "at least"}},
		{name: "ErrStatusRetentionBelowDuplicateWindow", env: map[string]string{"STANDALONE": "1", "STATUS_RETENTION": "1m", "DUPLICATE_WINDOW": "2m"}, wantErr: []string{"STATUS_RETENTION=1m0s", "DUPLICATE_WINDOW=2m0s"}},
		{name: "StatusRetentionBelowDuplicateWindowWithEventsOff", env: map[string]string{"STANDALONE": "1", "STATUS_RETENTION": "1m", "DUPLICATE_WINDOW": "2m", "EVENTS": "false"}, check: func(t *testing.T, c *settings) {}},
		// A batch limit above BATCH_INFLIGHT_BYTES' 64 MiB, the latter unset: the bound on
		// batches in flight follows the batch limit, and the API starts.
		{name: "LargeBatchesWithoutInflightSetting", env: map[string]string{"STANDALONE": "1", "BATCH_MAX_BYTES": "100000000"}, check: func(t *testing.T, c *settings) {
			api, err := ingest.New(c.ingest.Config, nil, nil, zerolog.Nop())
			if err != nil || api == nil {
				t.Fatalf("the ingest API does not start: %v", err)
			}
		}},
		{name: "ErrStrayArgument", args: []string{"-standalone", "extra"}, wantErr: []string{"unexpected arguments"}},
		{name: "ErrUnknownFlag", args: []string{"-nope"}, wantErr: []string{"nope"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, err := parse(c.args, env(c.env), io.Discard)
			if c.wantErr == nil {
				if err != nil {
					t.Fatalf("parse: %v", err)
				}
				c.check(t, got)
				return
			}
			if err == nil {
				t.Fatalf("parse succeeded, want an error naming %v", c.wantErr)
			}
			for _, w := range c.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// A bad NATS_URL is reported without the password in it.
func TestSettingsErrorsHidePasswords(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"nats://u:pa55word@n1:4222,http://u:pa55word@n2:4222", // wrong scheme
		"nats://u:pa55%zzword@n1:4222",                        // an escape that is not one
		"nats://u:pa55#word@n1:4222",                          // a character that needs escaping
		"nats://u:pa55,word@n1:4222",                          // a comma splits the list
	} {
		_, err := parse(nil, env(map[string]string{"STANDALONE": "1", "NATS_URL": url}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "NATS_URL") {
			t.Fatalf("NATS_URL=%s: err = %v, want one naming NATS_URL", url, err)
		}
		if strings.Contains(err.Error(), "pa55") || strings.Contains(err.Error(), "word@") {
			t.Fatalf("the error shows the password: %v", err)
		}
	}
	_, err := parse(nil, env(map[string]string{"STANDALONE": "1", "NATS_USER": "u"}), io.Discard)
	if err != nil {
		t.Fatalf("NATS_USER alone is checked when connecting, not parsing: %v", err)
	}
}

// A token short enough to guess is refused at start, naming the setting and how to make
// a good one, never showing the token (issue 59, finding 2: ADMIN_TOKEN=admin-tok-123
// started without a word). One of 32 characters is taken.
func TestShortTokensAreRefusedAtStart(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("ab", 16)
	for _, c := range []struct{ env, value, short string }{
		{"ADMIN_TOKEN", "admin-tok-123", "admin-tok-123"},
		{"INGEST_TOKEN", long + ",ingest-tok-123", "ingest-tok-123"},
	} {
		// Cancelled: were the token taken, the standalone would stop as soon as it started.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := run(ctx, nil, env(map[string]string{"STANDALONE": "true", "DATA_DIR": t.TempDir(), c.env: c.value}), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.env) || !strings.Contains(err.Error(), "openssl rand -hex 32") || strings.Contains(err.Error(), c.short) {
			t.Errorf("%s with a short token: err = %v, want one naming %s and openssl rand -hex 32, without the token", c.env, err, c.env)
		}
	}
	if _, err := parse(nil, env(map[string]string{"STANDALONE": "true", "ADMIN_TOKEN": long, "INGEST_TOKEN": long + "," + long}), io.Discard); err != nil {
		t.Fatalf("tokens of 32 characters: %v", err)
	}
}

// The start-up hint is a command that works with the ingest settings in force, naming
// secrets by variable, never by value.
func TestReadyHint(t *testing.T) {
	t.Parallel()
	const url = "http://127.0.0.1:8080/v1/requests"
	for _, c := range []struct {
		name      string
		in        cli.Ingest
		want, not []string
	}{
		{"Open", cli.Ingest{}, []string{"curl -i -H 'Content-Type: application/json' -d '{\"clientId\":\"alice\",\"n\":1}' " + url}, []string{"Authorization", "(with"}},
		{"OneToken", cli.Ingest{Tokens: "s3cret"}, []string{`-H "Authorization: Bearer $INGEST_TOKEN"`, url, "(with INGEST_TOKEN set"}, []string{"s3cret"}},
		{"SeveralTokens", cli.Ingest{Tokens: "s3cret,0ther"}, []string{`-H "Authorization: Bearer $TOKEN"`, "TOKEN set to a token"}, []string{"s3cret", "0ther"}},
		{"TokensFile", cli.Ingest{TokensFile: "/etc/tokens"}, []string{`-H "Authorization: Bearer $TOKEN"`}, nil},
		{"MutualTLS", cli.Ingest{ClientCA: "/etc/ca.pem"}, []string{`--cert "$CLIENT_CERT" --key "$CLIENT_KEY"`, "INGEST_TLS_CLIENT_CA"}, []string{"Authorization"}},
	} {
		hint := readyHint(url, &c.in)
		for _, w := range c.want {
			if !strings.Contains(hint, w) {
				t.Errorf("%s: hint %q lacks %q", c.name, hint, w)
			}
		}
		for _, n := range c.not {
			if strings.Contains(hint, n) {
				t.Errorf("%s: hint %q holds %q", c.name, hint, n)
			}
		}
	}
}

// The standalone logs the address each listener bound: the real port, and every
// interface as such, not as loopback (a demo raven on ":0", as in the compose stack),
// while the dispatcher still reaches that raven on loopback. Its hint is the command
// that works with the token set, and the token appears nowhere in its log. With
// RAVEN_SIGNING_SECRET, the dispatcher signs each attempt and its demo raven verifies it.
func TestStandaloneLogsTheAddressesItBound(t *testing.T) {
	const token = "s3cret-t0ken-of-at-least-32-characters"
	const signingSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	logs := &logLines{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// The directory before the cleanup that stops the standalone: cleanups run last
	// first, so it is removed only once the standalone stopped writing there (made in
	// the goroutine, its removal could come first and find the store still writing).
	dataDir := t.TempDir()
	go func() {
		done <- run(ctx, nil, env(map[string]string{"STANDALONE": "true", "DATA_DIR": dataDir, "NATS_SYNC": "interval", "LOG_FORMAT": "json",
			"INGEST_ADDR": "127.0.0.1:0", "OPS_ADDR": "127.0.0.1:0", "DEMO_RAVEN_ADDR": ":0", "INGEST_TOKEN": token, "DISPATCH_INTERVAL": "100ms",
			"RAVEN_SIGNING_SECRET": signingSecret}), io.Discard, logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the standalone did not stop within 30s")
		}
	})

	bound := func(line map[string]any, field string) *url.URL {
		t.Helper()
		u, err := url.Parse(fmt.Sprint(line[field]))
		if err != nil || u.Port() == "" || u.Port() == "0" {
			t.Fatalf("%s = %v: not a URL with the port bound", field, line[field])
		}
		return u
	}
	demo := bound(logs.wait(t, "demo raven listening"), "url")
	if ip := net.ParseIP(demo.Hostname()); ip == nil || !ip.IsUnspecified() {
		t.Errorf("the demo raven listens on every interface, and logs %s", demo)
	}
	ready := logs.wait(t, "standalone ready")
	ingestURL := bound(ready, "ingest")
	if ingestURL.Hostname() != "127.0.0.1" || !strings.Contains(fmt.Sprint(ready["message"]), `-H "Authorization: Bearer $INGEST_TOKEN"`) {
		t.Errorf("ready line %v: want ingest on 127.0.0.1 and a hint with the token header", ready)
	}
	if !strings.Contains(fmt.Sprint(ready["message"]), ingestURL.String()) {
		t.Errorf("the hint %q does not send to the URL ingest bound, %s", ready["message"], ingestURL)
	}
	ops := bound(logs.wait(t, "dispatching"), "ops")
	if resp, err := http.Get(ops.JoinPath("healthz").String()); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET the logged ops URL's /healthz: %v %v", resp, err)
	}

	// A second standalone on the same DATA_DIR is refused, saying why, and the first goes
	// on (below). Two used to start on one store, and each sent the same request to raven.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	err := run(ctx2, nil, env(map[string]string{"STANDALONE": "true", "DATA_DIR": dataDir, "LOG_FORMAT": "json",
		"INGEST_ADDR": "127.0.0.1:0", "OPS_ADDR": "127.0.0.1:0", "DEMO_RAVEN_ADDR": "127.0.0.1:0"}), io.Discard, &logLines{})
	if err == nil || ctx2.Err() != nil || !strings.Contains(err.Error(), "in use by another") {
		t.Errorf("a second standalone on the same DATA_DIR: %v (after %v); want it refused at once, saying the directory is in use", err, ctx2.Err())
	}

	// The hint's request: refused without the token, queued with it, and delivered to
	// the demo raven.
	post := func(auth string) int {
		req, _ := http.NewRequest(http.MethodPost, ingestURL.String(), strings.NewReader(`{"clientId":"alice","n":1}`))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(""); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d, want 401", code)
	}
	if code := post("Bearer " + token); code != http.StatusAccepted {
		t.Fatalf("with the token: %d, want 202", code)
	}
	logs.wait(t, "raven received") // signed by the dispatcher, verified by the demo raven
	if strings.Contains(logs.text(), token) {
		t.Error("the token is in the log")
	}
	if strings.Contains(logs.text(), strings.TrimPrefix(signingSecret, "whsec_")) {
		t.Error("the signing secret is in the log")
	}
}

// logLines collects a process's JSON log lines, for a test to wait for one.
type logLines struct {
	mu    sync.Mutex
	raw   strings.Builder
	lines []map[string]any
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.raw.Write(p)
	for line := range strings.SplitSeq(strings.TrimSpace(string(p)), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			l.lines = append(l.lines, m)
		}
	}
	return len(p), nil
}

func (l *logLines) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.raw.String()
}

// wait returns the first line whose message starts with prefix, waiting up to 30s.
func (l *logLines) wait(t *testing.T, prefix string) map[string]any {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		l.mu.Lock()
		for _, m := range l.lines {
			if strings.HasPrefix(fmt.Sprint(m["message"]), prefix) {
				l.mu.Unlock()
				return m
			}
		}
		l.mu.Unlock()
	}
	t.Fatalf("no log line %q within 30s; the log:\n%s", prefix, l.text())
	return nil
}
