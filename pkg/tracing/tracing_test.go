package tracing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/penguinhq/dispatcher/pkg/tracing"
)

var otelVars = []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
	"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"}

func clearEnv(t *testing.T) {
	for _, k := range otelVars {
		t.Setenv(k, "")
	}
}

// With no OTLP endpoint in the environment tracing is off: no provider, so no span is
// made and no exporter runs; OTEL_SDK_DISABLED and OTEL_TRACES_EXPORTER=none turn it off
// even with one.
func TestTracingIsOffWithoutAnEndpoint(t *testing.T) {
	clearEnv(t)
	if tp, _, err := tracing.FromEnv(context.Background(), "test"); tp != nil || err != nil {
		t.Fatalf("no endpoint: provider %v, %v; want none", tp, err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	for k, v := range map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "none"} {
		t.Setenv(k, v)
		if tp, _, err := tracing.FromEnv(context.Background(), "test"); tp != nil || err != nil {
			t.Fatalf("%s=%s: provider %v, %v; want none", k, v, tp, err)
		}
		t.Setenv(k, "")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	if _, _, err := tracing.FromEnv(context.Background(), "test"); err == nil || !strings.Contains(err.Error(), "http/protobuf") {
		t.Fatalf("protocol grpc: %v; want an error that says only http/protobuf is exported", err)
	}
}

// With an endpoint, spans are exported there with OTLP over HTTP.
func TestSpansAreExportedToTheEndpoint(t *testing.T) {
	clearEnv(t)
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" && r.Header.Get("Content-Type") == "application/x-protobuf" {
			posts.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	tp, shutdown, err := tracing.FromEnv(context.Background(), "test")
	if err != nil || tp == nil {
		t.Fatalf("with an endpoint: %v, %v", tp, err)
	}
	_, span := tp.Tracer(tracing.Name).Start(context.Background(), "a span")
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if posts.Load() == 0 {
		t.Fatal("the endpoint received no traces")
	}
}

func TestTraceIDOfATraceparent(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": "4bf92f3577b34da6a3ce929d0e0e4736",
		"": "", "garbage": "", "00-4bf92f3577b34da6a3ce929d0e0e4736x00f067aa0ba902b7-01": "",
	} {
		if got := tracing.TraceID(in); got != want {
			t.Errorf("TraceID(%q) = %q, want %q", in, got, want)
		}
	}
}
