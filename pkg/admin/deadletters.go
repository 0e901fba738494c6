package admin

import (
	"cmp"
	"context"
	"errors"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/tracing"
)

// DeadLetters lists up to limit dead letters f selects, oldest first, and how many it
// selects in all. Their bodies and headers are left out: bodies can be large, and may
// hold what operators should not see in passing; DeadLetterBodies shows them.
func (s *Service) DeadLetters(ctx context.Context, f queue.DeadFilter, limit int) (list []request.DeadLetter, total int, err error) {
	if err := checkFilter(f); err != nil {
		return nil, 0, err
	}
	if limit < 0 {
		return nil, 0, invalid("limit %d: give how many to list (0 for the default, 100)", limit)
	}
	limit = cmp.Or(limit, 100)
	list = []request.DeadLetter{}
	for r, err := range s.q.DeadLetterHeaders(ctx, f) {
		if err != nil {
			return list, total, err
		}
		total++
		if len(list) < limit {
			r.Body, r.Headers = nil, nil
			list = append(list, r)
		}
	}
	return list, total, nil
}

// MaxBodies is the most dead letters DeadLetterBodies shows at once.
const MaxBodies = 20

// DeadLetterBody is a dead letter with what was stored of it: its headers, and its body
// as text when it is UTF-8, else in base64.
type DeadLetterBody struct {
	request.DeadLetter
	ContentType string              `json:"contentType,omitempty"`
	Headers     map[string][]string `json:"headers"`
	Body        *string             `json:"body,omitempty"`
	BodyBase64  []byte              `json:"bodyBase64,omitempty"`
	// RavenAnswer is raven's answer to the attempt that dead-lettered the request, read
	// from the request's events (the dead-letter stream keeps only its status): nil when
	// raven did not answer, or the events no longer hold it (STATUS_RETENTION,
	// EVENTS=false).
	RavenAnswer *request.Response `json:"ravenAnswer,omitempty"`
}

// DeadLetterBodies shows up to MaxBodies dead letters f selects, with their headers and
// bodies, and how many it selects in all. Select one by id, or a few by client.
func (s *Service) DeadLetterBodies(ctx context.Context, f queue.DeadFilter, limit int) (list []DeadLetterBody, total int, err error) {
	if err := checkFilter(f); err != nil {
		return nil, 0, err
	}
	if limit < 0 {
		return nil, 0, invalid("limit %d: give how many to list (0 for the default, %d)", limit, MaxBodies)
	}
	if limit == 0 || limit > MaxBodies {
		limit = MaxBodies
	}
	list = []DeadLetterBody{}
	for r, err := range s.q.DeadLetters(ctx, f) {
		if err != nil {
			return list, total, err
		}
		total++
		if len(list) < limit {
			d := DeadLetterBody{DeadLetter: r, ContentType: r.ContentType, Headers: r.Headers}
			if utf8.Valid(r.Body) {
				text := string(r.Body)
				d.Body = &text
			} else {
				d.BodyBase64 = r.Body
			}
			list = append(list, d)
		}
	}
	for i, d := range list {
		if d.LastStatus != 0 {
			list[i].RavenAnswer = s.ravenAnswer(ctx, d.DeadLetter)
		}
	}
	return list, total, nil
}

// ravenAnswer is raven's answer that dead-lettered d, from the request's latest
// dead_lettered event of d's cycle; nil when its events do not hold it or cannot be
// read (the dead letter is shown without it).
func (s *Service) ravenAnswer(ctx context.Context, d request.DeadLetter) *request.Response {
	events, err := s.q.Events(ctx, d.ClientID, d.ID)
	if err != nil {
		s.log.Debug().Err(err).Str("request_id", d.ID).Msg("raven's answer to a dead letter could not be read")
		return nil
	}
	var answer *request.Response
	for _, e := range events {
		if e.Type == request.EventDeadLettered && e.Cycle == d.Cycle && e.Response != nil {
			answer = e.Response
		}
	}
	return answer
}

func checkFilter(f queue.DeadFilter) error {
	if f.ClientID != "" {
		if err := request.ValidateClientID(f.ClientID); err != nil {
			return invalid("client: %s", err)
		}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return invalid("since %s is not before until %s", f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339))
	}
	return nil
}

// Replay outcomes of one dead letter.
const (
	ReplayWouldRequeue = "would_requeue" // dry run
	ReplayRequeued     = "requeued"
	ReplayAlready      = "already_requeued" // an earlier, interrupted run had queued it
	ReplaySkipped      = "skipped"          // it stays in the dead-letter stream; see Why
)

// ReplayItem is what a replay did with one dead letter.
type ReplayItem struct {
	request.DeadLetter
	Outcome string `json:"outcome"`
	Why     string `json:"why,omitempty"`
}

// ReplayReport sums a replay up.
type ReplayReport struct {
	DryRun   bool `json:"dryRun"`
	Matched  int  `json:"matched"`
	Requeued int  `json:"requeued"`
	Skipped  int  `json:"skipped"`
	// Through is the dead-letter stream's sequence of the newest dead letter matched:
	// a replay confirmed after a dry run passes it on, so that it takes what the dry
	// run counted and nothing dead-lettered since.
	Through uint64 `json:"through"`
}

// Replay puts the dead letters f selects back at the end of their clients' queues,
// oldest first, keeping their ids; with dryRun it only says which it would. An empty
// filter replays everything and needs all to be true. each, if not nil, hears of every
// dead letter as it is handled. A replay stopped midway (an error, ctx) can be run again:
// what it requeued is gone from the dead-letter stream, and a dead letter requeued but
// not yet removed is not queued twice.
func (s *Service) Replay(ctx context.Context, f queue.DeadFilter, all, dryRun bool, each func(ReplayItem)) (ReplayReport, error) {
	rep := ReplayReport{DryRun: dryRun}
	unselective := f
	unselective.Through = 0 // a bound alone still takes every dead letter up to it
	if unselective.IsZero() && !all {
		return rep, invalid("replaying every dead letter needs \"all\": true; or select them by id, client, reason or time range")
	}
	if err := checkFilter(f); err != nil {
		return rep, err
	}
	for r, err := range s.q.DeadLetters(ctx, f) {
		if err != nil {
			return rep, err
		}
		rep.Matched++
		rep.Through = max(rep.Through, r.Seq)
		item := ReplayItem{DeadLetter: r, Outcome: ReplayWouldRequeue}
		if !dryRun {
			if item, err = s.replay(ctx, r); err != nil {
				return rep, err // the queue is unreachable: stop; running again is safe
			}
		}
		item.Body, item.Headers = nil, nil // reported, not kept: bodies can be large
		if item.Outcome == ReplaySkipped {
			rep.Skipped++
		} else if !dryRun {
			rep.Requeued++
		}
		if each != nil {
			each(item)
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	return rep, nil
}

// replay requeues one dead letter. A full backlog or queue, or a dead letter with no
// client to go back to, skips it; any other error is returned.
func (s *Service) replay(ctx context.Context, r request.DeadLetter) (ReplayItem, error) {
	item := ReplayItem{DeadLetter: r}
	if s.tracer != nil {
		// A span of its own, linked to the request's original trace; the request goes back
		// with the replay's context, so its next attempts are the replay's children.
		_, orig := tracing.Extract(ctx, r.TraceParent, r.TraceState)
		opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithAttributes(attribute.String("dispatch.request_id", r.ID),
			attribute.Int("dispatch.cycle", r.Cycle+1), attribute.String("dispatch.dead_reason", string(r.Reason)))}
		if orig.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: orig, Attributes: []attribute.KeyValue{attribute.String("dispatch.link", "replay of")}}))
		}
		spanCtx, span := s.tracer.Start(ctx, "dispatch.replay", opts...)
		defer func() {
			span.SetAttributes(attribute.String("dispatch.outcome", item.Outcome))
			span.End()
		}()
		r.TraceParent, r.TraceState = tracing.Inject(spanCtx)
	}
	queued, seq, err := s.q.Requeue(ctx, r)
	switch {
	case errors.Is(err, request.ErrBacklogFull), errors.Is(err, request.ErrQueueFull), err != nil && r.ClientID == "":
		item.Outcome, item.Why = ReplaySkipped, err.Error()
		return item, nil
	case err != nil:
		return item, err
	case queued:
		item.Outcome = ReplayRequeued
	default:
		item.Outcome = ReplayAlready
	}
	if s.replayed != nil {
		s.replayed.Inc()
	}
	if queued {
		ev := request.Event{Type: request.EventReplayed, ID: r.ID, ClientID: r.ClientID, Cycle: r.Cycle + 1, Seq: seq,
			AcceptedAt: r.AcceptedAt, Reason: r.Reason, Instance: s.instance, NotBefore: r.ReplayNotBefore(time.Now())}
		if err := s.q.WriteEvent(ctx, ev); err != nil {
			// The request is queued all the same; its status says dead_lettered until its
			// next attempt's event.
			s.log.Warn().Err(err).Str("request_id", r.ID).Func(tracing.Log(r.TraceParent)).Msg("the replayed event was not written")
		}
	}
	s.log.Info().Str("request_id", r.ID).Func(tracing.Log(r.TraceParent)).Str("client_id", r.ClientID).Str("outcome", item.Outcome).Msg("dead letter replayed")
	return item, nil
}
