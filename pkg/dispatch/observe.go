package dispatch

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
	"github.com/penguinhq/dispatcher/pkg/tracing"
)

// Observing an attempt: what operators see of it (activity, metrics, spans), apart from
// deciding what it means (schedule.Policy.Decide) and settling it (settle.go).

// noteAttempt remembers an attempt for the console (Activity and the client's history).
func (d *Dispatcher) noteAttempt(job schedule.Job, st request.Stored, attempt int, start, end time.Time, outcome schedule.Outcome, status int, err error) {
	if err != nil {
		status = request.RavenStatus(err)
	}
	at := introspect.Attempt{ID: st.ID, Attempt: attempt, Start: start, End: end, Interval: job.Interval, Outcome: outcome, Status: status}
	if !job.PrevEnd.IsZero() {
		at.Gap, at.HasGap = start.Sub(job.PrevEnd), true
	}
	d.activity.attempt(job.Lane, at)
}

// deadLettered counts a dead letter for reason, in the metrics and the Activity.
func (d *Dispatcher) deadLettered(reason request.Reason) {
	d.cfg.Metrics.deadLettered(reason)
	d.activity.deadLettered(reason, d.now())
}

// startAttempt starts an attempt's span, a child of the trace context stored with the
// request (the accept span, or the replay's); an attempt after the first also links to
// it, as a retry. Tracing off: ctx as it is and no span.
func (d *Dispatcher) startAttempt(ctx context.Context, job schedule.Job, st request.Stored, attempt int, start time.Time) (context.Context, trace.Span) {
	if d.tracer == nil {
		return ctx, nil
	}
	ctx, parent := tracing.Extract(ctx, st.TraceParent, st.TraceState)
	// How long it waited in its lane before this attempt: since it was accepted (or
	// requeued), or since its previous attempt ended.
	since := st.AcceptedAt
	if attempt > 1 && job.PrevEnd.After(since) {
		since = job.PrevEnd
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(start),
		trace.WithAttributes(attribute.String("dispatch.request_id", st.ID), attribute.Int("dispatch.attempt", attempt),
			attribute.Int("dispatch.cycle", st.Cycle), attribute.Float64("dispatch.waited_seconds", max(0, start.Sub(since).Seconds())))}
	if attempt > 1 && parent.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: parent, Attributes: []attribute.KeyValue{attribute.String("dispatch.link", "retry")}}))
	}
	return d.tracer.Start(ctx, "dispatch.attempt", opts...)
}

// endAttempt ends an attempt's span with its outcome, raven's status, and the
// dead-lettering it led to, if it did.
func endAttempt(span trace.Span, outcome schedule.Outcome, status int, err error, deadReason request.Reason) {
	span.SetAttributes(attribute.String("dispatch.outcome", string(outcome)))
	if status != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	if err != nil {
		span.SetStatus(codes.Error, string(outcome))
	}
	if deadReason != "" {
		span.AddEvent("dispatch.dead_lettered", trace.WithAttributes(attribute.String("dispatch.reason", string(deadReason))))
	}
	span.End()
}
