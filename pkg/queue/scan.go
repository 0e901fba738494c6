package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// scanStall is how long a scan waits for a message, with some pending, before it gives
// up.
const scanStall = 10 * time.Second

// scan calls fn with each message of s on filter (empty: all), in order, up to the stream's last
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
	cons, it, filter, err := scanFrom(ctx, s, filter, headersOnly)
	if err != nil {
		return err
	}
	defer it.Stop()
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return nil // nothing on this filter
	}
	progress := time.Now()
	var seen uint64 // the stream sequence of the last message received
	for {
		m, err := it.Next(jetstream.NextMaxWait(time.Second))
		if errors.Is(err, nats.ErrTimeout) {
			// Slow, or what was pending has been deleted meanwhile: ask the server.
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Nothing pending means the server sent everything, not that it arrived: on
			// a slow link the last messages may still be on their way. Done only once
			// the last one sent was received (or none was sent).
			ci, err := cons.Info(ctx)
			if err == nil && ci.NumPending == 0 && (ci.Delivered.Consumer == 0 || ci.Delivered.Stream <= seen) {
				return nil
			}
			// Nothing for a long while with messages pending: the consumer is stuck (its
			// stream's leader changing, a node catching up). Say so rather than wait for
			// the caller's whole deadline; trying again makes a new consumer.
			if time.Since(progress) > scanStall {
				return fmt.Errorf("reading %s: no message for %s though some are pending (the stream's leader may be changing); try again", filter, scanStall)
			}
			continue
		}
		progress = time.Now()
		if err != nil {
			return fmt.Errorf("reading %s: %w", filter, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		seen = md.Sequence.Stream
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

// scanFrom opens an ordered consumer of s from its start on filter (the whole stream
// when empty), and the iterator over its messages. It returns the filter as errors name
// it.
func scanFrom(ctx context.Context, s jetstream.Stream, filter string, headersOnly bool) (jetstream.Consumer, jetstream.MessagesContext, string, error) {
	// No filter reads the whole stream: a filter that matches every subject would make
	// the server count the pending messages subject by subject.
	var filters []string
	if filter != "" {
		filters = []string{filter}
	} else {
		filter = "stream " + s.CachedInfo().Config.Name
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects:    filters,
		HeadersOnly:       headersOnly,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return nil, nil, filter, fmt.Errorf("reading %s: %w", filter, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return nil, nil, filter, fmt.Errorf("reading %s: %w", filter, err)
	}
	return cons, it, filter, nil
}
