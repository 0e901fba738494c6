package ingest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// deafRecord is a record whose watch hears nothing, and whose reads find the request
// delivered from the second read on: its delivered event was published a moment before
// the watch's subscription was in place, and stored only after the first read.
type deafRecord struct{ reads atomic.Int32 }

func (d *deafRecord) StatusEvents(_ context.Context, clientID, id string) ([]request.Event, error) {
	acc := request.Event{Type: request.EventAccepted, ID: id, ClientID: clientID, At: time.Now(), AcceptedAt: time.Now()}
	if d.reads.Add(1) == 1 {
		return []request.Event{acc}, nil
	}
	return []request.Event{acc, {Type: request.EventDelivered, ID: id, ClientID: clientID, At: time.Now(), Attempt: 1, Status: 200}}, nil
}
func (*deafRecord) Place(context.Context, request.Status) *request.QueuePlace { return nil }
func (*deafRecord) WatchEvents(_, _ string, _ func(request.Event)) (func(), error) {
	return func() {}, nil
}
func (*deafRecord) AskQueued(context.Context, string, string) (request.Found, bool, error) {
	return request.Found{}, false, nil
}

// A waiting status read whose watch missed the final event (published just before the
// subscription was in place, stored just after the first read) finds it by reading the
// record again within a quarter of a second, instead of answering queued when the wait
// ends. Found by the cancel's integration test, whose Wait hung for the whole long poll
// about one run in two on a slow disk. (In a synctest bubble: the wait takes no time.)
func TestAWaitingReadFindsAFinalEventItsWatchMissed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api, err := ingest.New(ingest.Config{Status: &deafRecord{}}, stored{}, stored{}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		id := request.NewID(time.Now())
		start := time.Now()
		rec := httptest.NewRecorder()
		api.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/requests/"+id+"?clientId=c&wait=30s", nil))
		var st request.Status
		if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || rec.Code != http.StatusOK || st.State != request.StateDelivered {
			t.Fatalf("a waiting read: %d %s, want 200 delivered", rec.Code, rec.Body)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("the waiting read found the delivery after %s (of its 30 s wait); the record is read again within a second", took)
		}
	})
}

// chattyRecord is a record that never finds a final event, whose watch hears an attempt
// fail every second for ten seconds.
type chattyRecord struct{ deafRecord }

func (c *chattyRecord) StatusEvents(_ context.Context, clientID, id string) ([]request.Event, error) {
	c.reads.Add(1)
	return []request.Event{{Type: request.EventAccepted, ID: id, ClientID: clientID, At: time.Now(), AcceptedAt: time.Now()}}, nil
}

func (*chattyRecord) WatchEvents(clientID, id string, fn func(request.Event)) (func(), error) {
	stop := make(chan struct{})
	go func() {
		for i := range 10 {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			fn(request.Event{Type: request.EventAttemptFailed, ID: id, ClientID: clientID, At: time.Now(), Attempt: i + 1, Status: 503})
		}
	}()
	return func() { close(stop) }, nil
}

// A waiting read reads the record only a few times, however long it waits and however
// many events its watch hears: once, then again 0.25, 0.75, 1.75 and 3.75 s in (what was
// published before the watch began is stored by then), and once more when its wait ends.
// The events it hears are merged with the last read, not read again. (It used to read the record at each event heard
// and every 8 s to the end of the wait: 1,000 waiting reads made a few hundred a second.)
func TestAWaitingReadReadsTheRecordAFewTimesOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &chattyRecord{}
		api, err := ingest.New(ingest.Config{Status: rec}, stored{}, stored{}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		id := request.NewID(time.Now())
		w := httptest.NewRecorder()
		api.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/requests/"+id+"?clientId=c&wait=30s", nil))
		var st request.Status
		if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || w.Code != http.StatusOK || st.State != request.StateQueued || st.Attempts != 10 {
			t.Fatalf("a 30 s waiting read: %d %s, want 200 queued with the 10 attempts its watch heard", w.Code, w.Body)
		}
		if n := rec.reads.Load(); n != 6 {
			t.Fatalf("the record was read %d times in a 30 s wait that heard 10 events; want 6", n)
		}
	})
}

// lateRecord is a record whose watch hears nothing and whose reads find the request
// delivered once ten seconds have passed: an event the watch missed after its re-reads
// had stopped.
type lateRecord struct {
	deafRecord
	from time.Time
}

func (l *lateRecord) StatusEvents(_ context.Context, clientID, id string) ([]request.Event, error) {
	l.reads.Add(1)
	evs := []request.Event{{Type: request.EventAccepted, ID: id, ClientID: clientID, At: l.from, AcceptedAt: l.from}}
	if time.Since(l.from) >= 10*time.Second {
		evs = append(evs, request.Event{Type: request.EventDelivered, ID: id, ClientID: clientID, At: time.Now(), Attempt: 1, Status: 200})
	}
	return evs, nil
}

// When the wait ends, its answer is the record as it is then (G10), not as it was at
// the last re-read: a final event the watch missed later than that is in it.
func TestAWaitingReadAnswersTheRecordAsItIsWhenItsWaitEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &lateRecord{from: time.Now()}
		api, err := ingest.New(ingest.Config{Status: rec}, stored{}, stored{}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		id := request.NewID(time.Now())
		w := httptest.NewRecorder()
		api.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/requests/"+id+"?clientId=c&wait=30s", nil))
		var st request.Status
		if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || w.Code != http.StatusOK || st.State != request.StateDelivered {
			t.Fatalf("a 30 s waiting read of a request delivered 10 s in, unheard: %d %s, want 200 delivered", w.Code, w.Body)
		}
	})
}

// leftRecord is a record with nothing for the request at the first read, whose
// dispatchers no longer find it queued, and that holds its delivery from the second read
// on: delivered and removed between the read and the ask.
type leftRecord struct {
	deafRecord
	asked atomic.Bool
}

func (l *leftRecord) StatusEvents(_ context.Context, clientID, id string) ([]request.Event, error) {
	if l.reads.Add(1) == 1 {
		return nil, nil
	}
	return []request.Event{{Type: request.EventDelivered, ID: id, ClientID: clientID, At: time.Now(), Attempt: 1, Status: 200}}, nil
}

func (l *leftRecord) AskQueued(context.Context, string, string) (request.Found, bool, error) {
	l.asked.Store(true)
	return request.Found{}, false, nil
}

// A request that leaves the queue between the read that found no record and the ask of
// the dispatchers is not answered unknown: its outcome is recorded before it leaves, and
// the record is read again once the dispatchers say it is not queued.
func TestARequestThatLeftDuringTheLookupIsNotUnknown(t *testing.T) {
	rec := &leftRecord{}
	if code, body := readDelivered(t, rec); code != 0 {
		t.Fatalf("a read of a request delivered during its lookup: %d %s, want 200 delivered", code, body)
	}
	if !rec.asked.Load() {
		t.Fatal("the dispatchers were not asked: the test did not take the lookup's path")
	}
}

// keptRecord is a record that has nothing of the request, whose dispatchers find it not
// queued with its delivered event kept in the request stream (ADR 9).
type keptRecord struct{ deafRecord }

func (*keptRecord) StatusEvents(context.Context, string, string) ([]request.Event, error) {
	return nil, nil
}

func (*keptRecord) AskQueued(_ context.Context, clientID, id string) (request.Found, bool, error) {
	return request.Found{Kept: []request.Event{{Type: request.EventDelivered, ID: id, ClientID: clientID, At: time.Now(), Attempt: 1, Status: 200}}}, false, nil
}

// A request removed while the events stream refused its final event reads as its
// outcome, from the event the request stream keeps, not as unknown. (Found by the soak:
// three accepted requests read unknown during a disk-full fault.)
func TestARequestWhoseFinalEventIsKeptReadsAsItsOutcome(t *testing.T) {
	if code, body := readDelivered(t, &keptRecord{}); code != 0 {
		t.Fatalf("a read of a request whose delivered event is kept: %d %s, want 200 delivered", code, body)
	}
}

// readDelivered reads a new id's status from an ingest over record: 0 when it is 200
// delivered, else the answer's code and body.
func readDelivered(t *testing.T, record ingest.StatusReader) (int, string) {
	t.Helper()
	api, err := ingest.New(ingest.Config{Status: record}, stored{}, stored{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	api.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/requests/"+request.NewID(time.Now())+"?clientId=c", nil))
	var st request.Status
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || w.Code != http.StatusOK || st.State != request.StateDelivered {
		return max(w.Code, 1), w.Body.String()
	}
	return 0, ""
}
