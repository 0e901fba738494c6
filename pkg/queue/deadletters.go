package queue

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/retry"
)

// AddDeadLetter writes st to the dead-letter stream with headers saying why. It does not
// delete st from the queue: the caller does that once this returned nil. Writing the same
// stored request twice (a crash between the two steps) keeps one copy.
func (q *Queue) AddDeadLetter(ctx context.Context, st request.Stored, why request.Verdict) error {
	if _, err := request.PartitionOf(st.Subject); err != nil {
		return fmt.Errorf("dead-lettering request %s: %w", st.ID, err)
	}
	token, err := request.TokenOf(st.Subject)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(request.DeadLetterPrefix + token)
	h := msg.Header
	h.Set(request.HeaderID, st.ID)
	if st.ContentType != "" {
		h.Set(request.HeaderContentType, st.ContentType)
	}
	setPlanHeaders(h, st.Request)
	h.Set(headerDeadReason, string(why.Reason))
	h.Set(headerDeadLastStatus, strconv.Itoa(why.LastStatus))
	if why.LastError != "" {
		h.Set(headerDeadLastError, headerSafe(why.LastError))
	}
	h.Set(headerDeadAttempts, strconv.Itoa(why.Attempts))
	h.Set(headerDeadFirstAttempt, formatTime(why.FirstAttempt))
	h.Set(headerDeadLastAttempt, formatTime(why.LastAttempt))
	h.Set(headerDeadAcceptedAt, formatTime(st.AcceptedAt))
	h.Set(headerDeadOrigSeq, strconv.FormatUint(st.Seq, 10))
	h.Set(headerDeadOrigSubject, st.Subject)
	msg.Data = st.Body
	// The message id names this stored copy, not the request: a request replayed and
	// dead-lettered again within the window must not be taken for a duplicate.
	msgID := st.ID + ":" + strconv.FormatUint(st.Seq, 10)
	_, err = q.js.PublishMsg(ctx, msg, jetstream.WithMsgID(msgID), jetstream.WithExpectStream(DeadLetterStream))
	q.writes.note(err)
	if err != nil {
		return fmt.Errorf("dead-lettering request %s: %w", st.ID, err)
	}
	return nil
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// headerSafe keeps an error text to one line of bounded length.
func headerSafe(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}

// deadLetterOf reads back what AddDeadLetter wrote: the message at seq of the dead-letter
// stream, stored at at.
func deadLetterOf(subject string, h nats.Header, body []byte, seq uint64, at time.Time) request.DeadLetter {
	st := storedOf(subject, h, body, seq, at)
	status, _ := strconv.Atoi(h.Get(headerDeadLastStatus))
	attempts, _ := strconv.Atoi(h.Get(headerDeadAttempts))
	parse := func(k string) time.Time { t, _ := time.Parse(time.RFC3339Nano, h.Get(k)); return t }
	return request.DeadLetter{
		Seq: seq, ID: st.ID, ClientID: st.ClientID, AcceptedAt: parse(headerDeadAcceptedAt),
		Verdict: request.Verdict{
			Reason:       request.Reason(h.Get(headerDeadReason)),
			LastStatus:   status,
			LastError:    h.Get(headerDeadLastError),
			Attempts:     attempts,
			FirstAttempt: parse(headerDeadFirstAttempt),
			LastAttempt:  parse(headerDeadLastAttempt),
		},
		DeadAt: at, BodyBytes: len(body), ContentType: st.ContentType, Body: body, Subject: subject, Headers: h, Cycle: st.Cycle,
		NotBefore: st.NotBefore, TraceParent: st.TraceParent, TraceState: st.TraceState,
	}
}

// DeadFilter selects dead letters; its zero value selects all.
type DeadFilter struct {
	ClientID string         // only this client's
	ID       string         // only the request with this id
	Reason   request.Reason // only those dead-lettered for this reason
	Since    time.Time      // dead-lettered at or after
	Until    time.Time      // dead-lettered before
	// IDs, when not empty, selects only the requests with these ids (and ID, if set).
	IDs []string
	// Through, when not 0, selects only dead letters at or before this sequence of the
	// dead-letter stream: what a dry run saw, not what came after it.
	Through uint64
}

// IsZero reports whether f selects every dead letter.
func (f DeadFilter) IsZero() bool {
	return f.ClientID == "" && f.ID == "" && f.Reason == "" && f.Since.IsZero() && f.Until.IsZero() && len(f.IDs) == 0 && f.Through == 0
}

func (f DeadFilter) subject() string {
	if f.ClientID != "" {
		return request.DeadLetterSubject(f.ClientID)
	}
	return request.DeadLetterPrefix + ">"
}

func (f DeadFilter) match(r request.DeadLetter, ids map[string]bool) bool {
	return (f.ID == "" || r.ID == f.ID) && (ids == nil || ids[r.ID]) && (f.Reason == "" || r.Reason == f.Reason) &&
		(f.Since.IsZero() || !r.DeadAt.Before(f.Since)) && (f.Until.IsZero() || r.DeadAt.Before(f.Until))
}

// DeadLetters yields each dead letter f selects, oldest first, up to the last one
// written when it began (so that a replay that fails again is not met twice). An error
// ends it, yielded last.
func (q *Queue) DeadLetters(ctx context.Context, f DeadFilter) iter.Seq2[request.DeadLetter, error] {
	return q.deadLetters(ctx, f, false)
}

// DeadLetterHeaders is DeadLetters without their bodies, which the server leaves out:
// for lists and counts (BodyBytes still says each body's size).
func (q *Queue) DeadLetterHeaders(ctx context.Context, f DeadFilter) iter.Seq2[request.DeadLetter, error] {
	return q.deadLetters(ctx, f, true)
}

func (q *Queue) deadLetters(ctx context.Context, f DeadFilter, headersOnly bool) iter.Seq2[request.DeadLetter, error] {
	return func(yield func(request.DeadLetter, error) bool) {
		errStop := errors.New("stopped")
		var ids map[string]bool
		if len(f.IDs) > 0 {
			ids = make(map[string]bool, len(f.IDs))
			for _, id := range f.IDs {
				ids[id] = true
			}
		}
		err := q.scan(ctx, q.dead, f.subject(), headersOnly, func(m jetstream.Msg, md *jetstream.MsgMetadata) error {
			if f.Through != 0 && md.Sequence.Stream > f.Through {
				return errStop // in order: every one after is newer than the dry run
			}
			r := deadLetterOf(m.Subject(), m.Headers(), m.Data(), md.Sequence.Stream, md.Timestamp)
			if headersOnly {
				r.BodyBytes, _ = strconv.Atoi(m.Headers().Get(nats.MsgSize))
				r.Body = nil
			}
			if !f.match(r, ids) || yield(r, nil) {
				return nil
			}
			return errStop
		})
		if err != nil && !errors.Is(err, errStop) {
			yield(request.DeadLetter{}, err)
		}
	}
}

// Requeue puts a dead letter back at the end of its client's queue, keeping its id (and
// its Not-Before while that is ahead: DeadLetter.ReplayNotBefore), and only then removes
// it from the dead-letter stream. Requeueing the same dead letter twice
// within the duplicate window (an interrupted replay run again) queues it once; requeued
// reports whether this call queued it. A full backlog or queue is returned as the
// request.ErrBacklogFull or request.ErrQueueFull it is, and the dead letter stays. seq is the request's
// sequence in the request stream now.
func (q *Queue) Requeue(ctx context.Context, r request.DeadLetter) (requeued bool, seq uint64, err error) {
	dup, seq, err := q.requeuePublish(ctx, r)
	if err != nil {
		return false, 0, err
	}
	// Removing it is retried for a while: past DUPLICATE_WINDOW, a dead letter left
	// behind would be queued again by the next replay.
	_, err = retry.Do(ctx, retry.Policy{First: 100 * time.Millisecond, Max: 2 * time.Second, Tries: 6}, func(ctx context.Context) error {
		if err := q.dead.DeleteMsg(ctx, r.Seq); err != nil && !isNotFound(err) {
			return err
		}
		return nil
	})
	if err != nil {
		return !dup, seq, fmt.Errorf("request %s is queued again but dead letter %d could not be removed; run the replay again within %s, when it is recognised as queued, or remove it: %w",
			r.ID, r.Seq, q.cfg.DuplicateWindow, err)
	}
	return !dup, seq, nil
}

// requeuePublish is Requeue's first step: it publishes r to its client's subject and
// says whether JetStream found it a duplicate.
func (q *Queue) requeuePublish(ctx context.Context, r request.DeadLetter) (duplicate bool, seq uint64, err error) {
	if r.ClientID == "" {
		return false, 0, fmt.Errorf("dead letter %d (request %s) has no valid clientId in its subject %q: it cannot be requeued", r.Seq, r.ID, r.Subject)
	}
	msg := requestMsg(request.Request{ID: r.ID, ClientID: r.ClientID, ContentType: r.ContentType, Body: r.Body, Cycle: r.Cycle + 1,
		NotBefore: r.ReplayNotBefore(time.Now()), TraceParent: r.TraceParent, TraceState: r.TraceState})
	// The message id names this dead letter, not the request: the request's own id may
	// still be in the window from when ingest took it.
	ack, err := q.js.PublishMsg(ctx, msg, jetstream.WithMsgID("replay:"+r.ID+":"+strconv.FormatUint(r.Seq, 10)),
		jetstream.WithExpectStream(RequestStream))
	if err != nil {
		return false, 0, classifyPublishError(err)
	}
	return ack.Duplicate, ack.Sequence, nil
}
