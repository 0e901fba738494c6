package cli

import (
	"context"
	"os"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/penguinhq/dispatcher/pkg/tracing"
)

// Tracing returns the tracer provider the standard OTEL_* environment asks for (nil:
// tracing is off) and a stop that flushes what is left, waiting at most 5 s.
func Tracing(ctx context.Context, service string, log zerolog.Logger) (trace.TracerProvider, func(), error) {
	tp, shutdown, err := tracing.FromEnv(ctx, service)
	if err != nil || tp == nil {
		return nil, func() {}, err
	}
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	log.Info().Str("endpoint", endpoint).Msg("traces are exported with OTLP/HTTP")
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			log.Warn().Err(err).Msg("flushing the last traces")
		}
	}, nil
}
