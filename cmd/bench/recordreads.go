package main

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/pkg/queue"
)

// The reads of the record scenario's design layouts (recordLayouts), on the bench's own
// RECORD stream; the service's layouts read with the service's own code.

// readMultiLast is ADR 8's read: the last message of each of the id's subjects.
func readMultiLast(ctx context.Context, nc *nats.Conn, client, id string, _ uint64) (int, bool, error) {
	msgs, err := directBatch(ctx, nc, map[string]any{"multi_last": []string{"rec.*." + id + ".*"}, "batch": 8})
	if err != nil {
		return 1, false, err
	}
	for _, m := range msgs {
		if m.Header.Get("Dispatch-Id") == id {
			return 1, true, nil
		}
	}
	return 1, false, nil
}

// readByTime finds id on its client's subject from the id's own time on (less a second
// for clocks apart), a batch at a time.
func readByTime(ctx context.Context, nc *nats.Conn, client, id string, _ uint64) (int, bool, error) {
	at, err := idTime(id)
	if err != nil {
		return 0, false, err
	}
	req := map[string]any{"next_by_subj": "rec." + client + ".delivered", "start_time": at.Add(-time.Second).UTC(), "batch": 64, "max_bytes": 256 << 10}
	for trips := 1; trips <= 64; trips++ {
		msgs, err := directBatch(ctx, nc, req)
		if err != nil || len(msgs) == 0 {
			return trips, false, err
		}
		for _, m := range msgs {
			if m.Header.Get("Dispatch-Id") == id {
				return trips, true, nil
			}
		}
		last, _ := strconv.ParseUint(msgs[len(msgs)-1].Header.Get("Nats-Sequence"), 10, 64)
		delete(req, "start_time")
		req["seq"] = last + 1
	}
	return 64, false, nil
}

// readBisect reads as readByTime does, one batch from the id's time on; when the id is
// not in it and the batch ended before it (a backlogged client: the finals of the
// requests ahead of it came first), it bisects the stream's sequences after the batch
// for the client's first final of a request accepted no earlier than this one (a
// client's finals come in the order its requests were accepted; each says its place,
// seq, which the id would have to carry), a round trip a step. Ids alone do not give the
// order: two accepted in one millisecond sort by their random bits.
func readBisect(ctx context.Context, nc *nats.Conn, client, id string, seq uint64) (int, bool, error) {
	at, err := idTime(id)
	if err != nil {
		return 0, false, err
	}
	subj := "rec." + client + ".delivered"
	msgs, err := directBatch(ctx, nc, map[string]any{"next_by_subj": subj, "start_time": at.Add(-time.Second).UTC(), "batch": 64, "max_bytes": 256 << 10})
	if err != nil || len(msgs) == 0 {
		return 1, false, err
	}
	placeOf := func(m *nats.Msg) uint64 { n, _ := strconv.ParseUint(m.Header.Get("Dispatch-Seq"), 10, 64); return n }
	for _, m := range msgs {
		if m.Header.Get("Dispatch-Id") == id {
			return 1, true, nil
		} else if placeOf(m) > seq {
			return 1, false, nil // a later request's final: this one has none
		}
	}
	lo, _ := strconv.ParseUint(msgs[len(msgs)-1].Header.Get("Nats-Sequence"), 10, 64)
	lo++
	last, err := directBatch(ctx, nc, map[string]any{"multi_last": []string{subj}, "batch": 1})
	if err != nil || len(last) == 0 {
		return 2, false, err
	}
	hi, _ := strconv.ParseUint(last[0].Header.Get("Nats-Sequence"), 10, 64)
	hi++
	trips := 2
	// Invariant: every final of the client before lo is of an earlier request, and the
	// first at or after hi (if any) is of this one or a later one.
	for lo < hi {
		mid := lo + (hi-lo)/2
		trips++
		got, err := directBatch(ctx, nc, map[string]any{"next_by_subj": subj, "seq": mid, "batch": 1})
		if err != nil {
			return trips, false, err
		}
		if len(got) == 0 {
			hi = mid
			continue
		}
		at, _ := strconv.ParseUint(got[0].Header.Get("Nats-Sequence"), 10, 64)
		switch {
		case got[0].Header.Get("Dispatch-Id") == id:
			return trips, true, nil
		case placeOf(got[0]) < seq:
			lo = at + 1
		default:
			hi = mid
		}
	}
	return trips, false, nil
}

// readJumps starts from the client's last final (one direct get of the subject's last
// message) and walks back by its pointers, each a direct get by exact sequence: to the
// jump while it does not pass the request's place, else to the parent. The writer must
// know each final's sequence (a dispatcher has it from its write's acknowledgement, and
// a new owner from the client's last final).
func readJumps(ctx context.Context, nc *nats.Conn, client, id string, seq uint64) (int, bool, error) {
	num := func(m *nats.Msg, h string) uint64 { n, _ := strconv.ParseUint(m.Header.Get(h), 10, 64); return n }
	msgs, err := directBatch(ctx, nc, map[string]any{"multi_last": []string{"rec." + client + ".delivered"}, "batch": 1})
	trips := 1
	for {
		if err != nil || len(msgs) == 0 {
			return trips, false, err
		}
		m := msgs[0]
		place := num(m, "Dispatch-Seq")
		switch {
		case m.Header.Get("Dispatch-Id") == id:
			return trips, true, nil
		case place <= seq || m.Header.Get("Dispatch-Parent") == "":
			return trips, false, nil // passed it, or at the first: it has no final
		}
		next := num(m, "Dispatch-Parent")
		if num(m, "Dispatch-Jump-Place") >= seq {
			next = num(m, "Dispatch-Jump")
		}
		trips++
		msgs, err = directBatch(ctx, nc, map[string]any{"seq": next, "batch": 1})
	}
}

// directBatch is one batched direct get of the bench's RECORD stream.
func directBatch(ctx context.Context, nc *nats.Conn, req map[string]any) ([]*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	batch, _ := req["batch"].(int)
	return queue.DirectBatch(ctx, nc, "RECORD", req, batch)
}
