package queue

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// lookupSkew is how far apart the time in a request's id (ingest's clock, when it
// accepted it) and the time the server stored it (the server's clock) may be for the
// direct lookup to find it: the lookup reads the client's requests stored from this long
// before the id's time to this long after. Past it (clocks further apart than this), a
// request is still found, by the scan lookupQueued falls back to.
const lookupSkew = 30 * time.Second

// lookupBatch is how many of a client's requests each direct get of a lookup reads.
const lookupBatch = 16

// lookupQueued finds request id of clientID in the queue, for a status read that found
// no record of it. An id ingest made carries its time (request.IDTime), so the request is
// found with direct gets on the client's subject from that time on (the server finds a
// time by binary search and a subject by its index): a few messages read, whatever the
// queue holds. Only when that window does not hold it (a keyed id, which carries no
// time; clocks further apart than lookupSkew; a request not queued) is the client's queue
// scanned, headers only, to say so for certain.
func (q *Queue) lookupQueued(ctx context.Context, id, clientID string) (request.Stored, bool, error) {
	if err := request.ValidateClientID(clientID); err != nil {
		return request.Stored{}, false, err
	}
	if at, ok := request.IDTime(id); ok {
		s, found, err := q.lookupNear(ctx, id, clientID, at)
		if err != nil || found {
			return s, found, err
		}
	}
	f, ok, err := q.FindRequest(ctx, id, clientID)
	return f.Stored, ok, err
}

// lookupNear reads clientID's requests stored within lookupSkew of at, looking for id.
func (q *Queue) lookupNear(ctx context.Context, id, clientID string, at time.Time) (request.Stored, bool, error) {
	type get struct {
		Seq       uint64     `json:"seq,omitempty"`
		NextFor   string     `json:"next_by_subj"`
		StartTime *time.Time `json:"start_time,omitempty"`
		Batch     int        `json:"batch"`
	}
	from := at.Add(-lookupSkew)
	req := get{NextFor: request.RequestPrefix + "*." + request.EncodeClientID(clientID), StartTime: &from, Batch: lookupBatch}
	until := at.Add(lookupSkew)
	for {
		msgs, err := DirectBatch(ctx, q.nc, RequestStream, req, lookupBatch)
		if err != nil {
			return request.Stored{}, false, err
		}
		var seq uint64
		for _, m := range msgs {
			seq, _ = strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
			stored, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
			if stored.After(until) {
				return request.Stored{}, false, nil
			}
			if m.Header.Get(request.HeaderID) == id {
				return storedOf(m.Header.Get(jetstream.SubjectHeader), m.Header, nil, seq, stored), true, nil
			}
		}
		if len(msgs) < lookupBatch || seq == 0 {
			return request.Stored{}, false, nil
		}
		req.StartTime, req.Seq = nil, seq+1
	}
}

// keptOutcomes are the final events of request id kept in the request stream (ADR 9:
// the events stream did not take them before the request was removed) and not yet
// written to the events stream: what became of a request that left the queue while its
// record cannot say so yet. Read from the client's outcome subject, a few at most.
func (q *Queue) keptOutcomes(ctx context.Context, id, clientID string) ([]request.Event, error) {
	type get struct {
		Seq     uint64 `json:"seq"`
		NextFor string `json:"next_by_subj"`
		Batch   int    `json:"batch"`
	}
	req := get{Seq: 1, NextFor: request.OutcomeSubject(clientID), Batch: lookupBatch}
	var kept []request.Event
	for read := 0; read < maxKeptRead; {
		msgs, err := DirectBatch(ctx, q.nc, RequestStream, req, lookupBatch)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			var e request.Event
			if json.Unmarshal(m.Data, &e) == nil && e.ID == id && e.ClientID == clientID && e.Final() {
				kept = append(kept, e)
			}
			req.Seq, _ = strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
			req.Seq++
		}
		read += len(msgs)
		if len(msgs) < lookupBatch {
			break
		}
	}
	return kept, nil
}

// maxKeptRead bounds the kept final events of one client a lookup reads: they are
// written to the events stream as soon as it takes writes again.
const maxKeptRead = 1024
