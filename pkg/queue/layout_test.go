package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/record"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// The status record keeps a subject per client and event type, never one per request
// (ADR 10, issue 34): 300 requests over 3 clients, each with every kind of event, leave
// at most 3 × 7 subjects, and each request's status still reads right. Before ADR 10 the
// same events left 900 subjects (one per request and type).
func TestTheRecordKeepsASubjectPerClientNotPerRequest(t *testing.T) {
	t.Parallel()
	nc, q := openOnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := runWriter(t, q, nil)
	clients := []string{"ann", "ben", "cy"}
	type req struct {
		client, id string
		state      request.State
	}
	var reqs []req
	for i := range 300 {
		r := req{client: clients[i%3], id: request.NewID(time.Now())}
		w.Record(request.Event{Type: request.EventAttemptStarted, ID: r.id, ClientID: r.client, Seq: uint64(i + 1)})
		w.Record(request.Event{Type: request.EventAttemptStarted, ID: r.id, ClientID: r.client, Attempt: 1})
		switch i % 3 {
		case 0:
			w.Record(request.Event{Type: request.EventDelivered, ID: r.id, ClientID: r.client, Attempt: 1, Status: 200})
			r.state = request.StateDelivered
		case 1:
			w.Record(request.Event{Type: request.EventAttemptFailed, ID: r.id, ClientID: r.client, Attempt: 1, Status: 503})
			r.state = request.StateQueued
		default:
			w.Record(request.Event{Type: request.EventDeadLettered, ID: r.id, ClientID: r.client, Attempt: 1, Status: 400, Reason: request.ReasonPermanent})
			r.state = request.StateDeadLettered
		}
		reqs = append(reqs, r)
	}
	stored(t, w)
	js, _ := jetstream.New(nc)
	s, err := js.Stream(ctx, queue.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.NumSubjects; n > uint64(len(clients)*len(request.EventTypes)) {
		t.Fatalf("%d subjects after %d requests over %d clients, want at most %d: a subject per request", n, len(reqs), len(clients), len(clients)*len(request.EventTypes))
	}
	for _, r := range reqs {
		st, err := q.Status(ctx, r.client, r.id)
		if err != nil || st.State != r.state || st.ClientID != r.client || st.Attempts != 1 {
			t.Fatalf("status of %s (%s): %+v %v, want %s after 1 attempt", r.id, r.client, st, err, r.state)
		}
		if st, _ := q.Status(ctx, "nobody", r.id); st.State != request.StateUnknown {
			t.Fatalf("status of %s read under another client: %+v, want unknown", r.id, st)
		}
	}
}

// A request behind a long backlog of its client: its final event comes after more of its
// client's events than one read returns (256), and is still found.
func TestABackloggedClientsRequestIsFound(t *testing.T) {
	t.Parallel()
	q, w, ctx := openWithWriter(t)
	id := request.NewID(time.Now())
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: id, ClientID: "deb", Seq: 1})
	for i := range 700 {
		other := request.NewID(time.Now())
		w.Record(request.Event{Type: request.EventAttemptStarted, ID: other, ClientID: "deb", Seq: uint64(i + 2)})
		w.Record(request.Event{Type: request.EventDelivered, ID: other, ClientID: "deb", Attempt: 1, Status: 200})
	}
	stored(t, w)
	if st, err := q.Status(ctx, "deb", id); err != nil || st.State != request.StateInFlight {
		t.Fatalf("status behind 700 others: %+v %v, want in flight", st, err)
	}
	w.Record(request.Event{Type: request.EventDelivered, ID: id, ClientID: "deb", Attempt: 1, Status: 201})
	stored(t, w)
	if st, err := q.Status(ctx, "deb", id); err != nil || st.State != request.StateDelivered || st.RavenStatus != 201 {
		t.Fatalf("status once delivered after 700 others: %+v %v, want delivered (201)", st, err)
	}
}

// A status read of an idle client's request asks the server for one event at a time
// (direct gets without a batch): a batched get makes the server also count what is
// pending after it, a walk over every block from where the read starts to the client's
// last event of that type, loading each whose subject state expired. For an hour-old
// request of an active client that is dozens of block loads (BENCHMARKS.md). An idle
// client's read finds each event it looks for first, so none of its scans goes on to
// batches. Before, every scan was batched (16 events, then 256).
func TestAnIdleClientsStatusIsReadWithoutBatches(t *testing.T) {
	t.Parallel()
	nc, q := openOnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := runWriter(t, q, nil)
	for range 50 { // the client's earlier requests, and another client's
		for _, c := range []string{"ida", "ike"} {
			other := request.NewID(time.Now())
			w.Record(request.Event{Type: request.EventAttemptStarted, ID: other, ClientID: c, Seq: 1})
			w.Record(request.Event{Type: request.EventDelivered, ID: other, ClientID: c, Attempt: 1, Status: 200})
		}
	}
	stored(t, w)
	time.Sleep(time.Second) // past the read's margin for clocks apart (half a second)
	id := request.NewID(time.Now())
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: id, ClientID: "ida", Seq: 2})
	w.Record(request.Event{Type: request.EventAttemptFailed, ID: id, ClientID: "ida", Attempt: 1, Status: 503})
	w.Record(request.Event{Type: request.EventDelivered, ID: id, ClientID: "ida", Attempt: 2, Status: 200})
	stored(t, w)
	var st request.Status
	gets := directGets(t, nc, func() (err error) { st, err = q.Status(ctx, "ida", id); return err })
	if st.State != request.StateDelivered || st.Attempts != 2 {
		t.Fatalf("status: %+v, want delivered after 2 attempts", st)
	}
	for _, get := range gets {
		if get.Batch > 0 {
			t.Errorf("the read sent a get of a batch of %d for %s (of %d gets): want gets of one event each", get.Batch, get.Subject, len(gets))
		}
	}
}

// directGet is what a direct get of the events stream asks for.
type directGet struct {
	Subject   string    `json:"next_by_subj"`
	Batch     int       `json:"batch"`
	StartTime time.Time `json:"start_time"`
}

// directGets runs read, which reads the events stream on nc, and says what direct gets
// it sent: their copies reach this subscription before the server's answers do.
func directGets(t *testing.T, nc *nats.Conn, read func() error) []directGet {
	t.Helper()
	msgs := make(chan *nats.Msg, 256)
	sub, err := nc.ChanSubscribe("$JS.API.DIRECT.GET."+queue.EventStream, msgs)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := read(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var gets []directGet
	for n := len(msgs); n > 0; n-- {
		var get directGet
		if err := json.Unmarshal((<-msgs).Data, &get); err != nil {
			t.Fatal(err)
		}
		gets = append(gets, get)
	}
	if len(gets) == 0 {
		t.Fatal("no direct get seen: the test does not watch the read")
	}
	return gets
}

// A status read of a delivered request reads its acceptance, its replays and its
// delivery, not its client's other final subjects nor its attempts: each subject read is
// a walk by the server to the client's next event there, however far. The status is the
// one its whole timeline gives. Before, every status read read all seven subjects.
func TestADeliveredRequestsStatusReadsOnlyWhatItFollowsFrom(t *testing.T) {
	t.Parallel()
	nc, q := openOnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := runWriter(t, q, nil)
	id, queued := request.NewID(time.Now()), request.NewID(time.Now())
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: id, ClientID: "dot", Seq: 1})
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: queued, ClientID: "dot", Seq: 2})
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: id, ClientID: "dot", Seq: 1, Attempt: 1, At: time.Now()})
	w.Record(request.Event{Type: request.EventAttemptFailed, ID: id, ClientID: "dot", Seq: 1, Attempt: 1, Status: 503, At: time.Now()})
	w.Record(request.Event{Type: request.EventDelivered, ID: id, ClientID: "dot", Seq: 1, Attempt: 2, Status: 200, At: time.Now()})
	w.Record(request.Event{Type: request.EventAttemptFailed, ID: queued, ClientID: "dot", Seq: 2, Attempt: 1, Status: 503, At: time.Now()})
	stored(t, w)
	var st request.Status
	read := map[string]bool{}
	for _, get := range directGets(t, nc, func() (err error) { st, err = q.Status(ctx, "dot", id); return err }) {
		read[get.Subject[strings.LastIndexByte(get.Subject, '.')+1:]] = true
	}
	for _, typ := range []request.EventType{request.EventDeadLettered, request.EventPurged, request.EventAttemptStarted, request.EventAttemptFailed} {
		if read[string(typ)] {
			t.Errorf("the status read of a delivered request read its client's %s (read %v)", typ, read)
		}
	}
	if !read[string(request.EventDelivered)] {
		t.Errorf("the status read did not read the deliveries (read %v): the test does not watch it", read)
	}
	// The same status as from every event; and a request not delivered reads them all.
	for _, r := range []string{id, queued} {
		events, err := q.Events(ctx, "dot", r)
		if err != nil {
			t.Fatal(err)
		}
		st, err := q.Status(ctx, "dot", r)
		if err != nil {
			t.Fatal(err)
		}
		st.Queue = nil
		if full := request.StatusOf(r, events); !reflect.DeepEqual(st, full) {
			t.Errorf("status of %s: %+v, from all %d events: %+v", r, st, len(events), full)
		}
	}
	if st.State != request.StateDelivered || st.Attempts != 2 || st.RavenStatus != 200 {
		t.Errorf("status: %+v, want delivered (200) after 2 attempts", st)
	}
}

// A keyed id carries no time: its client's events are read from the start of the record
// (no acceptance is stored to say where they start, ADR 18). A copy accepted after the
// duplicate window (a higher sequence) is the one that counts.
func TestAKeyedRequestsStatusIsFound(t *testing.T) {
	t.Parallel()
	q, w, ctx := openWithWriter(t)
	id := request.IDFromKey("", "kim", "order-1")
	for i := range 300 { // events of kim's other requests before
		w.Record(request.Event{Type: request.EventAttemptStarted, ID: request.NewID(time.Now()), ClientID: "kim", Seq: uint64(i + 1)})
	}
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: id, ClientID: "kim", Seq: 400})
	w.Record(request.Event{Type: request.EventDelivered, ID: id, ClientID: "kim", Seq: 400, Attempt: 1, Status: 200})
	stored(t, w)
	if st, err := q.Status(ctx, "kim", id); err != nil || st.State != request.StateDelivered {
		t.Fatalf("keyed request: %+v %v, want delivered", st, err)
	}
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: id, ClientID: "kim", Seq: 900}) // the key sent again, much later
	stored(t, w)
	if st, err := q.Status(ctx, "kim", id); err != nil || st.State != request.StateInFlight {
		t.Fatalf("keyed request stored again: %+v %v, want the new copy in flight", st, err)
	}

	// A copy stored while the earlier one still waited: the earlier one's final event
	// comes after the new copy's first attempt, and does not end the read.
	again := request.IDFromKey("", "kim", "order-2")
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: again, ClientID: "kim", Seq: 1000})
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: again, ClientID: "kim", Seq: 1001})
	w.Record(request.Event{Type: request.EventDelivered, ID: again, ClientID: "kim", Seq: 1000, Attempt: 1, Status: 200})
	w.Record(request.Event{Type: request.EventDelivered, ID: again, ClientID: "kim", Seq: 1001, Attempt: 1, Status: 201})
	stored(t, w)
	if st, err := q.Status(ctx, "kim", again); err != nil || st.State != request.StateDelivered || st.RavenStatus != 201 {
		t.Fatalf("keyed request stored twice, both delivered: %+v %v, want the later copy's delivery (201)", st, err)
	}
}

// A replayed request's status is its latest cycle's, found past the first cycle's final
// event and the client's other events.
func TestAReplayedRequestReadsItsLatestCycle(t *testing.T) {
	t.Parallel()
	q, w, ctx := openWithWriter(t)
	id := request.NewID(time.Now())
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: id, ClientID: "rae", Seq: 1})
	w.Record(request.Event{Type: request.EventDeadLettered, ID: id, ClientID: "rae", Attempt: 1, Status: 400, Reason: request.ReasonPermanent})
	for i := range 300 {
		w.Record(request.Event{Type: request.EventAttemptStarted, ID: request.NewID(time.Now()), ClientID: "rae", Seq: uint64(i + 2)})
	}
	w.Record(request.Event{Type: request.EventReplayed, ID: id, ClientID: "rae", Seq: 400, Cycle: 1})
	stored(t, w)
	if st, err := q.Status(ctx, "rae", id); err != nil || st.State != request.StateQueued || st.Replays != 1 {
		t.Fatalf("replayed: %+v %v, want queued in its first replay", st, err)
	}
	w.Record(request.Event{Type: request.EventDelivered, ID: id, ClientID: "rae", Seq: 400, Cycle: 1, Attempt: 1, Status: 200})
	stored(t, w)
	if st, err := q.Status(ctx, "rae", id); err != nil || st.State != request.StateDelivered || st.Replays != 1 {
		t.Fatalf("replayed and delivered: %+v %v, want delivered in its first replay", st, err)
	}
}

// A watch of a request hears only its own request's events, of all its client's.
func TestAWatchHearsOnlyItsRequest(t *testing.T) {
	t.Parallel()
	nc, q := openOnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	heard := make(chan request.Event, 10)
	mine := request.NewID(time.Now())
	stop, err := q.WatchEvents("wes", mine, func(e request.Event) { heard <- e })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, e := range []request.Event{
		{Type: request.EventAttemptStarted, ID: request.NewID(time.Now()), ClientID: "wes"},
		{Type: request.EventAttemptStarted, ID: mine, ClientID: "wes"},
	} {
		if err := q.WriteEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case e := <-heard:
		if e.ID != mine {
			t.Fatalf("the watch of %s heard %s's event", mine, e.ID)
		}
	case <-ctx.Done():
		t.Fatal("the watch heard nothing")
	}
}

// An operator with an id alone: its client is found among the acceptances stored about
// its time; a keyed id, which holds no time, is not looked for.
func TestTheClientOfAnIDIsFoundFromItsAcceptance(t *testing.T) {
	t.Parallel()
	q, w, ctx := openWithWriter(t)
	for i := range 500 {
		w.Record(request.Event{Type: request.EventAttemptStarted, ID: request.NewID(time.Now()), ClientID: fmt.Sprint("c", i), Seq: uint64(i + 1)})
	}
	id := request.NewID(time.Now())
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: id, ClientID: "zoe", Seq: 501})
	keyed := request.IDFromKey("", "zoe", "k")
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: keyed, ClientID: "zoe", Seq: 502})
	stored(t, w)
	if c, ok, err := q.ClientOfEvents(ctx, id); err != nil || !ok || c != "zoe" {
		t.Fatalf("client of %s: %q %v %v, want zoe", id, c, ok, err)
	}
	if c, ok, err := q.ClientOfEvents(ctx, keyed); err != nil || ok {
		t.Fatalf("client of keyed %s: %q %v %v, want none looked for", keyed, c, ok, err)
	}
	if c, ok, err := q.ClientOfEvents(ctx, request.NewID(time.Now())); err != nil || ok {
		t.Fatalf("client of an id never accepted: %q %v %v, want none", c, ok, err)
	}
}

// openWithWriter opens a queue on a server of its own, with an event writer, for a test
// that lasts at most a minute.
func openWithWriter(t *testing.T) (*queue.Queue, *record.Writer, context.Context) {
	t.Helper()
	_, q := openOnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return q, runWriter(t, q, nil), ctx
}

// stored waits until every event recorded with w is written.
func stored(t *testing.T, w *record.Writer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// A status read of a delivered request reads its replays and its delivery, not its
// attempts: the delivery carries what the queued request said of its acceptance (its
// acceptedAt, notBefore, notAfter; no acceptance is stored, ADR 18), so fewer gets go to
// the server, and the status is the same as from every event. A request not delivered
// has its attempts read.
func TestADeliveredStatusIsReadWithoutItsAttempts(t *testing.T) {
	t.Parallel()
	nc, q := openOnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := runWriter(t, q, nil)
	at := time.Now().UTC().Truncate(time.Millisecond)
	nb, na := at.Add(time.Second), at.Add(time.Hour)
	done, waiting, again := request.NewID(at), request.NewID(at), request.NewID(at)
	for _, id := range []string{done, waiting, again} {
		w.Record(request.Event{Type: request.EventAttemptStarted, ID: id, ClientID: "eve", At: at, Seq: 7, AcceptedAt: at, NotBefore: nb, NotAfter: na})
	}
	w.Record(request.Event{Type: request.EventDelivered, ID: done, ClientID: "eve", At: nb, Attempt: 1, Status: 200, Seq: 7,
		AcceptedAt: at, NotBefore: nb, NotAfter: na})
	// Replayed, then delivered: the dispatcher's events of a later cycle carry no
	// acceptedAt (settle.go's eventOf); the replayed event carries the first acceptance's.
	w.Record(request.Event{Type: request.EventDeadLettered, ID: again, ClientID: "eve", At: nb, Attempt: 1, Status: 400, Seq: 7,
		Reason: request.ReasonPermanent, AcceptedAt: at, NotBefore: nb, NotAfter: na})
	w.Record(request.Event{Type: request.EventReplayed, ID: again, ClientID: "eve", At: nb.Add(time.Second), Cycle: 1, Seq: 9,
		AcceptedAt: at, NotBefore: nb, NotAfter: na})
	w.Record(request.Event{Type: request.EventDelivered, ID: again, ClientID: "eve", At: nb.Add(2 * time.Second), Cycle: 1, Attempt: 1,
		Status: 200, Seq: 9, NotBefore: nb, NotAfter: na})
	stored(t, w)

	attempts := request.ClientEventSubject("eve", request.EventAttemptStarted)
	for _, c := range []struct {
		id    string
		state request.State
		reads bool // the attempts' subject
	}{{done, request.StateDelivered, false}, {waiting, request.StateInFlight, true}, {again, request.StateDelivered, false}} {
		var st request.Status
		gets := directGets(t, nc, func() (err error) { st, err = q.Status(ctx, "eve", c.id); return err })
		all, err := q.Events(ctx, "eve", c.id)
		if err != nil {
			t.Fatal(err)
		}
		want := request.StatusOf(c.id, all)
		if st.State != c.state || !st.AcceptedAt.Equal(at) || !st.NotBefore.Equal(nb) || !st.NotAfter.Equal(na) ||
			st.State != want.State || !st.AcceptedAt.Equal(want.AcceptedAt) || st.Attempts != want.Attempts || st.Replays != want.Replays {
			t.Errorf("status of %s: %+v; want %s, as from every event: %+v", c.state, st, c.state, want)
		}
		if read := slices.ContainsFunc(gets, func(g directGet) bool { return g.Subject == attempts }); read != c.reads {
			t.Errorf("status of a %s request: its attempts read %v, want %v (gets %+v)", c.state, read, c.reads, gets)
		}
	}
}
