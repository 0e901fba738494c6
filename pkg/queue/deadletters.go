package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// DeadRecord is one request in the dead-letter stream.
type DeadRecord struct {
	request.Stored // Seq is the dead-letter stream's sequence; AcceptedAt when ingest took it
	request.DeadLetter
	// DeadAt is when it was dead-lettered.
	DeadAt time.Time
}

// DeadFilter selects dead letters; its zero value selects all.
type DeadFilter struct {
	ClientID string    // only this client's
	ID       string    // only the request with this id
	Reason   string    // only those dead-lettered for this reason
	Since    time.Time // dead-lettered at or after
	Until    time.Time // dead-lettered before
}

func (f DeadFilter) subject() string {
	if f.ClientID != "" {
		return deadLetterPrefix + request.EncodeClientID(f.ClientID)
	}
	return deadLetterPrefix + ">"
}

func (f DeadFilter) match(r DeadRecord) bool {
	return (f.ID == "" || r.ID == f.ID) && (f.Reason == "" || r.Reason == f.Reason) &&
		(f.Since.IsZero() || !r.DeadAt.Before(f.Since)) && (f.Until.IsZero() || r.DeadAt.Before(f.Until))
}

// EachDeadLetter calls fn with each dead letter f selects, oldest first, up to the last
// one written when it began (so that a replay that fails again is not met twice). fn
// returning an error stops the walk with that error.
func (q *Queue) EachDeadLetter(ctx context.Context, f DeadFilter, fn func(DeadRecord) error) error {
	return q.scan(ctx, q.dead, f.subject(), false, func(m jetstream.Msg, md *jetstream.MsgMetadata) error {
		r := deadRecordOf(m.Subject(), m.Headers(), m.Data(), md.Sequence.Stream, md.Timestamp)
		if !f.match(r) {
			return nil
		}
		return fn(r)
	})
}

// DeadLetters returns every dead letter, oldest first.
func (q *Queue) DeadLetters(ctx context.Context) ([]DeadRecord, error) {
	var out []DeadRecord
	err := q.EachDeadLetter(ctx, DeadFilter{}, func(r DeadRecord) error { out = append(out, r); return nil })
	return out, err
}

func deadRecordOf(subject string, h nats.Header, body []byte, seq uint64, at time.Time) DeadRecord {
	clientID, _ := request.DecodeClientID(subject[len(deadLetterPrefix):]) // "" for an undecodable subject
	status, _ := strconv.Atoi(h.Get(request.HeaderDeadLastStatus))
	attempts, _ := strconv.Atoi(h.Get(request.HeaderDeadAttempts))
	parse := func(k string) time.Time { t, _ := time.Parse(time.RFC3339Nano, h.Get(k)); return t }
	return DeadRecord{
		Stored: request.Stored{
			Request: request.Request{
				ID:          h.Get(request.HeaderID),
				ClientID:    clientID,
				ContentType: h.Get(request.HeaderContentType),
				Body:        body,
			},
			Seq:        seq,
			Subject:    subject,
			AcceptedAt: parse(request.HeaderDeadAcceptedAt),
		},
		DeadLetter: request.DeadLetter{
			Reason:       h.Get(request.HeaderDeadReason),
			LastStatus:   status,
			LastError:    h.Get(request.HeaderDeadLastError),
			Attempts:     attempts,
			FirstAttempt: parse(request.HeaderDeadFirstAttempt),
			LastAttempt:  parse(request.HeaderDeadLastAttempt),
		},
		DeadAt: at,
	}
}

// Requeue puts a dead letter back at the end of its client's queue, keeping its id, and
// only then removes it from the dead-letter stream. Requeueing the same dead letter twice
// within the duplicate window (an interrupted replay run again) queues it once; requeued
// reports whether this call queued it. A full backlog or queue is returned as the
// request.ErrBacklogFull or request.ErrQueueFull it is, and the dead letter stays.
func (q *Queue) Requeue(ctx context.Context, r DeadRecord) (requeued bool, err error) {
	dup, err := q.requeuePublish(ctx, r)
	if err != nil {
		return false, err
	}
	// Removing it is retried for a while: past DUPLICATE_WINDOW, a dead letter left
	// behind would be queued again by the next replay.
	wait := 100 * time.Millisecond
	for try := 1; ; try++ {
		err = q.dead.DeleteMsg(ctx, r.Seq)
		if err == nil || isNotFound(err) {
			return !dup, nil
		}
		if try == 6 || ctx.Err() != nil {
			return !dup, fmt.Errorf("request %s is queued again but dead letter %d could not be removed; run the replay again within %s, when it is recognised as queued, or remove it: %w",
				r.ID, r.Seq, q.cfg.DuplicateWindow, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// requeuePublish is Requeue's first step: it publishes r to its client's subject and
// says whether JetStream found it a duplicate.
func (q *Queue) requeuePublish(ctx context.Context, r DeadRecord) (duplicate bool, err error) {
	if r.ClientID == "" {
		return false, fmt.Errorf("dead letter %d (request %s) has no valid clientId in its subject %q: it cannot be requeued", r.Seq, r.ID, r.Subject)
	}
	msg := nats.NewMsg(requestPrefix + request.EncodeClientID(r.ClientID))
	msg.Header.Set(request.HeaderID, r.ID)
	if r.ContentType != "" {
		msg.Header.Set(request.HeaderContentType, r.ContentType)
	}
	msg.Data = r.Body
	// The message id names this dead letter, not the request: the request's own id may
	// still be in the window from when ingest took it.
	ack, err := q.js.PublishMsg(ctx, msg, jetstream.WithMsgID("replay:"+r.ID+":"+strconv.FormatUint(r.Seq, 10)),
		jetstream.WithExpectStream(RequestStream))
	if err != nil {
		return false, classifyPublishError(err)
	}
	return ack.Duplicate, nil
}

// scan calls fn with each message of s on filter, in order, up to the stream's last
// sequence when it began, reading through an ordered consumer that the server drops
// soon after the scan ends.
func (q *Queue) scan(ctx context.Context, s jetstream.Stream, filter string, headersOnly bool, fn func(jetstream.Msg, *jetstream.MsgMetadata) error) error {
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %s: %w", s.CachedInfo().Config.Name, err)
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{filter},
		HeadersOnly:       headersOnly,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("reading %s: %w", filter, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return fmt.Errorf("reading %s: %w", filter, err)
	}
	defer it.Stop()
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return nil // nothing on this filter
	}
	for {
		m, err := it.Next(jetstream.NextMaxWait(time.Second))
		if errors.Is(err, nats.ErrTimeout) {
			// Slow, or what was pending has been deleted meanwhile: ask the server.
			if ctx.Err() != nil {
				return ctx.Err()
			}
			ci, err := cons.Info(ctx)
			if err == nil && ci.NumPending == 0 {
				return nil
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", filter, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		if md.Sequence.Stream > last {
			return nil
		}
		if err := fn(m, md); err != nil {
			return err
		}
		if md.NumPending == 0 || md.Sequence.Stream == last {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
