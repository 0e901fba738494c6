// Package tracing sets up OpenTelemetry traces for the binaries and carries a request's
// trace context through the queue.
//
// Tracing is off unless the standard OpenTelemetry environment asks for an exporter
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT): then spans are
// exported with OTLP over HTTP (http/protobuf), configured by the other standard OTEL_*
// variables (headers, timeout, sampler, service name, resource attributes). Off, no
// provider exists and the code paths that would record spans are skipped: no exporter
// runs and no span is made.
//
// Spans carry request ids, attempt numbers, outcomes and statuses: never a clientId or a
// body.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Name is the instrumentation scope of the service's spans.
const Name = "github.com/penguinhq/dispatcher"

// Propagator reads and writes W3C traceparent and tracestate.
var Propagator = propagation.TraceContext{}

// FromEnv returns the tracer provider the environment asks for, and a shutdown that
// flushes it; nil and a no-op shutdown when tracing is off. service names the binary
// unless OTEL_SERVICE_NAME does.
func FromEnv(ctx context.Context, service string) (trace.TracerProvider, func(context.Context) error, error) {
	off := func(context.Context) error { return nil }
	if !Enabled(os.Getenv) {
		return nil, off, nil
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := os.Getenv(k); p != "" && p != "http/protobuf" {
			return nil, off, fmt.Errorf("%s=%s: traces are exported with OTLP over HTTP only (http/protobuf)", k, p)
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, off, fmt.Errorf("the OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, off, fmt.Errorf("the trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}

// Enabled says whether the environment (getenv) asks for traces to be exported.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Inject returns the trace context of ctx's span as the traceparent and tracestate to
// store with a request; empty when ctx has none. A tracestate longer than
// MaxTraceState is left out (W3C Trace Context lets a vendor drop it whole): it is stored
// beside the request's body, in the room the body leaves.
func Inject(ctx context.Context) (parent, state string) {
	c := propagation.MapCarrier{}
	Propagator.Inject(ctx, c)
	parent, state = c["traceparent"], c["tracestate"]
	if len(state) > MaxTraceState {
		state = ""
	}
	return parent, state
}

// MaxTraceState is the longest tracestate stored with a request: W3C Trace Context asks
// a participant to pass on at least 512 characters of it.
const MaxTraceState = 512

// FromHeader is the caller's trace context in h (traceparent, tracestate), validated as
// the propagator reads it, to store with a request and pass on to raven when this
// process traces nothing itself: an intermediary passes the caller's trace on. Empty
// when h has none, or one that is not valid.
func FromHeader(h http.Header) (parent, state string) {
	if h.Get("Traceparent") == "" {
		return "", ""
	}
	return Inject(Propagator.Extract(context.Background(), propagation.HeaderCarrier(h)))
}

// Extract returns ctx with the stored trace context as its remote parent, and that
// context; ctx as it is and an invalid context when there is none.
func Extract(ctx context.Context, parent, state string) (context.Context, trace.SpanContext) {
	if parent == "" {
		return ctx, trace.SpanContext{}
	}
	ctx = Propagator.Extract(ctx, propagation.MapCarrier{"traceparent": parent, "tracestate": state})
	return ctx, trace.SpanContextFromContext(ctx)
}

// TraceID is the trace id of a stored traceparent, for log lines; empty when it is not
// one.
func TraceID(traceparent string) string {
	if len(traceparent) != 55 || traceparent[2] != '-' || traceparent[35] != '-' { // version-traceid-spanid-flags
		return ""
	}
	return traceparent[3:35]
}

// Log adds a log line's trace_id from a stored traceparent, when there is one: for
// zerolog's Event.Func.
func Log(traceparent string) func(*zerolog.Event) {
	return func(e *zerolog.Event) {
		if id := TraceID(traceparent); id != "" {
			e.Str("trace_id", id)
		}
	}
}
