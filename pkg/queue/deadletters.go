package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// DeadRecord is one request in the dead-letter stream.
type DeadRecord struct {
	request.Stored
	request.DeadLetter
}

// DeadLetters returns the dead-letter stream's requests in the order they were written.
// It reads them one by one; it is meant for inspection and tests, not for hot paths.
func (q *Queue) DeadLetters(ctx context.Context) ([]DeadRecord, error) {
	var out []DeadRecord
	for seq := uint64(1); ; {
		m, err := q.dead.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(deadLetterPrefix+">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading dead letters: %w", err)
		}
		clientID, _ := request.DecodeClientID(m.Subject[len(deadLetterPrefix):]) // "" for an undecodable subject
		h := m.Header
		status, _ := strconv.Atoi(h.Get(request.HeaderDeadLastStatus))
		attempts, _ := strconv.Atoi(h.Get(request.HeaderDeadAttempts))
		out = append(out, DeadRecord{
			Stored: request.Stored{
				Request: request.Request{
					ID:          h.Get(request.HeaderID),
					ClientID:    clientID,
					ContentType: h.Get(request.HeaderContentType),
					Body:        m.Data,
				},
				Seq:        m.Sequence,
				Subject:    m.Subject,
				AcceptedAt: m.Time,
			},
			DeadLetter: request.DeadLetter{
				Reason:     h.Get(request.HeaderDeadReason),
				LastStatus: status,
				LastError:  h.Get(request.HeaderDeadLastError),
				Attempts:   attempts,
			},
		})
		seq = m.Sequence + 1
	}
}
