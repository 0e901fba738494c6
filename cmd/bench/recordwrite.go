package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Writing the record scenario's requests in one layout.

// written is one request whose record the record scenario wrote.
type written struct {
	client, id string
	seq        uint64
}

// recordWriter writes the record of requests in one layout, on one connection.
type recordWriter struct {
	l       recordLayout
	js      jetstream.JetStream
	payload map[string]any
	answer  map[string]any
	// For the jump-pointer layout: every final of every client, and the stream's last
	// sequence (this is its only writer, on one connection: the sequences follow).
	finals    [][]jumpNode
	streamSeq uint64
}

func newRecordWriter(l recordLayout, js jetstream.JetStream, c int) *recordWriter {
	rw := &recordWriter{l: l, js: js, payload: map[string]any{"type": "delivered", "attempt": 1, "status": 200, "instance": "bench-dispatcher-1"}}
	if l.body > 0 { // text, as a JSON answer is (zero bytes would be written six bytes each)
		rw.answer = map[string]any{"status": 200, "headers": map[string]string{"Content-Type": "application/json"},
			"body": string(jsonAnswer(l.body)), "bodyBytes": l.body}
		rw.payload["response"] = rw.answer
	}
	if l.jumps {
		rw.finals = make([][]jumpNode, c)
	}
	return rw
}

// writeAll writes n requests' records over c clients, and returns a sample of the last
// twenty-fourth written, for reads. With a lag, each client's last lag requests wait in a
// ring for their final event, written when the client's request lag rounds later is
// accepted: a read by time then passes the lag finals of the requests ahead of it.
func (rw *recordWriter) writeAll(n, c, lag int) ([]written, error) {
	l := rw.l
	clients := make([]string, c)
	for i := range clients {
		clients[i] = "c" + strconv.Itoa(i)
	}
	sample := make([]written, 0, 2000)
	ring := make([][]written, c)
	for i := range n {
		ci := i % c
		w := written{clients[ci], request.NewID(time.Now()), uint64(i + 1)}
		subjects := l.subjects(w.client, w.id)
		delivered := true
		if l.mixed {
			failed, dead := mixedRequest(i / c)
			switch {
			case dead:
				subjects = []string{subjects[0], request.ClientEventSubject(w.client, request.EventDeadLettered)}
				delivered = false
			case failed:
				subjects = []string{subjects[0], request.ClientEventSubject(w.client, request.EventAttemptFailed), subjects[1]}
			}
		}
		if lag > 0 {
			// The first event (ADR 8's accepted, the service's attempt_started) goes now, the final when its turn comes.
			if err := rw.write(w, subjects[:len(subjects)-1]); err != nil {
				return nil, err
			}
			ring[ci] = append(ring[ci], w)
			if len(ring[ci]) <= lag {
				continue // its final is not written: it is not sampled
			}
			w, ring[ci] = ring[ci][0], ring[ci][1:]
			subjects = l.subjects(w.client, w.id)[len(subjects)-1:]
		}
		if err := rw.write(w, subjects); err != nil {
			return nil, err
		}
		// Reads are of the last twenty-fourth written: the last hour of a day's retention
		// (issue 34's row). With a lag, their requests were accepted lag rounds earlier.
		if recent := n / 24; delivered && i >= n-recent && i%max(recent/cap(sample), 1) == 0 && len(sample) < cap(sample) {
			sample = append(sample, w)
		}
	}
	return sample, nil
}

// write writes w's messages on subjects.
func (rw *recordWriter) write(w written, subjects []string) error {
	l, payload := rw.l, rw.payload
	payload["id"], payload["clientId"], payload["seq"] = w.id, w.client, w.seq
	data, _ := json.Marshal(payload)
	for _, subj := range subjects {
		m := nats.NewMsg(subj)
		m.Header.Set("Dispatch-Id", w.id)
		if l.service { // as the service writes its events
			m.Header = nats.Header{request.EventIDHeader: {w.id}}
			payload["type"] = subj[strings.LastIndexByte(subj, '.')+1:]
			delete(payload, "response")
			if rw.answer != nil && payload["type"] != string(request.EventAttemptStarted) { // an attempt's outcome carries raven's answer
				payload["response"] = rw.answer
			}
			data, _ = json.Marshal(payload)
		}
		m.Header.Set("Dispatch-Seq", strconv.FormatUint(w.seq, 10))
		rw.streamSeq++
		if l.jumps {
			rw.jump(m, w)
		}
		m.Data = data
		// The figures are of what is retained, not the rate: a server that holds the
		// writes back for a while (a sync, a collection) is waited for.
		if _, err := rw.js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
			return err
		}
	}
	return nil
}

// jump adds w's jump pointers to m, and notes w's final.
func (rw *recordWriter) jump(m *nats.Msg, w written) {
	ci, _ := strconv.Atoi(w.client[1:])
	fs := rw.finals[ci]
	node := jumpNode{seq: rw.streamSeq, place: w.seq, jump: -1}
	if d := len(fs) - 1; d >= 0 { // the parent is fs[d]
		// Myers' rule: jump two jumps back when the parent's two jumps are of equal
		// length, else to the parent. A search from the last final to any earlier one
		// takes O(log n) steps.
		p := fs[d]
		node.jump = d
		if p.jump >= 0 && fs[p.jump].jump >= 0 && d-p.jump == p.jump-fs[p.jump].jump {
			node.jump = fs[p.jump].jump
		}
		m.Header.Set("Dispatch-Parent", strconv.FormatUint(p.seq, 10))
		m.Header.Set("Dispatch-Parent-Place", strconv.FormatUint(p.place, 10))
		j := fs[node.jump]
		m.Header.Set("Dispatch-Jump", strconv.FormatUint(j.seq, 10))
		m.Header.Set("Dispatch-Jump-Place", strconv.FormatUint(j.place, 10))
	}
	rw.finals[ci] = append(fs, node)
}
