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
func (*deafRecord) AskQueued(context.Context, string, string) (request.Status, bool, error) {
	return request.Status{}, false, nil
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
