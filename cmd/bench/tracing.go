package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracedProvider is the tracer provider of the tracing scenario's traced ingest.
var tracedProvider trace.TracerProvider

// otlpReceiver takes OTLP/HTTP trace exports, reading each whole, as a collector on the
// same machine would, and counts them.
type otlpReceiver struct {
	posts, bytes atomic.Int64
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	o.posts.Add(1)
	o.bytes.Add(n)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// benchTracing is what tracing costs: ingest's accepted/s (64 callers, fsync every 2
// minutes) and the dispatcher's sends/s, each with every request traced and its spans
// exported with OTLP/HTTP (batched, as the binaries export them) to a receiver in this
// process, against the same without tracing, in interleaved rounds.
func benchTracing(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	recv := &otlpReceiver{}
	url, stop, err := serve(recv)
	if err != nil {
		return nil, err
	}
	defer stop()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(url+"/v1/traces"))
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tracedProvider = tp

	var in, inTraced, ratios []float64
	for round := range s.ingestRounds {
		kinds := []string{kindIngest, kindIngestTraced}
		if round%2 == 1 {
			kinds = []string{kindIngestTraced, kindIngest}
		}
		got := map[string]float64{}
		for _, kind := range kinds {
			res, err := measureKind(ctx, kind, false, load{Workers: ingestWorkers, For: s.ingestFor})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", kind, err)
			}
			got[kind] = res.rate(s.ingestFor)
		}
		in, inTraced = append(in, got[kindIngest]), append(inTraced, got[kindIngestTraced])
		ratios = append(ratios, got[kindIngestTraced]/got[kindIngest])
		fmt.Fprintf(log, "bench: tracing: ingest round %d: %.0f/s untraced, %.0f/s traced\n", round+1, got[kindIngest], got[kindIngestTraced])
	}
	inRatio := median(ratios)

	clients := s.dispatchN[len(s.dispatchN)-1]
	var sends [2]float64
	for i, traced := range []bool{false, true} {
		settle()
		var with trace.TracerProvider
		if traced {
			with = tp
		}
		_, rate, err := dispatchOnce(ctx, s, clients, false, log, with)
		if err != nil {
			return nil, err
		}
		sends[i] = rate
	}
	exported := recv.posts.Load()
	fmt.Fprintf(log, "bench: tracing: %d exports, %d bytes received\n", exported, recv.bytes.Load())
	return []row{
		{
			figure:    "ingest accepted/s traced, spans exported with OTLP/HTTP (64 callers, 512 B, fsync every 2 min)",
			value:     fmt.Sprintf("%.0f/s", median(inTraced)),
			reference: fmt.Sprintf("%.0f/s untraced", median(in)),
			ratio:     fmt.Sprintf("%.2f", inRatio),
			target:    ">= 0.90",
			verdict:   verdict(inRatio >= 0.9 && exported > 0),
		},
		{
			figure:    fmt.Sprintf("dispatch sends/s traced, %d backlogged clients, %s interval (fsync every 2 min)", clients, s.interval),
			value:     fmt.Sprintf("%.0f/s", sends[1]),
			reference: fmt.Sprintf("%.0f/s untraced", sends[0]),
			ratio:     fmt.Sprintf("%.3f", sends[1]/sends[0]),
			target:    ">= 0.90",
			verdict:   verdict(sends[1]/sends[0] >= 0.9 && exported > 0),
		},
	}, nil
}
