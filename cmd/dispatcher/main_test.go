package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

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
			if c.dispatch.Interval != 5*time.Second || c.dataDir != "./data" || c.ingest.Addr != ":8080" || c.ingest.MaxBodyBytes != 1<<20-4<<10 || c.natsSync != "always" {
				t.Fatalf("defaults: interval %s, data %s, addr %s, body %d, sync %s", c.dispatch.Interval, c.dataDir, c.ingest.Addr, c.ingest.MaxBodyBytes, c.natsSync)
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
