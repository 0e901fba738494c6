package ingest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// emptyRecord is a record that holds no event of any request, whose dispatchers answer
// that the queue holds none either.
type emptyRecord struct{ deafRecord }

func (*emptyRecord) StatusEvents(context.Context, string, string) ([]request.Event, error) {
	return nil, nil
}

// A waiting status read of a request neither the record nor the queue holds (a
// clientId in the wrong case, an id never accepted) answers unknown without waiting:
// unknown says the request is not there, which waiting does not change. It takes only
// the record's re-reads after the dispatchers' answer (about a second: a request that
// just left the queue is found in them). It used to hold the answer for the whole wait,
// and the Go client's Wait asked again until its context ended. (In a synctest bubble:
// the time taken is exact.)
func TestAWaitingReadAnswersUnknownAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api, err := ingest.New(ingest.Config{Status: &emptyRecord{}}, stored{}, stored{}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		rec := httptest.NewRecorder()
		api.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/requests/"+request.NewID(start)+"?clientId=Olga&wait=30s", nil))
		var st request.Status
		if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || rec.Code != http.StatusOK || st.State != request.StateUnknown {
			t.Fatalf("a waiting read: %d %s, want 200 unknown", rec.Code, rec.Body)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("the waiting read answered unknown after %s of its 30 s wait, want within the record's re-reads (about 1 s)", took)
		}
	})
}

// queuedOnly is a record that holds no event of any request, whose dispatchers find
// every request queued.
type queuedOnly struct{ emptyRecord }

func (*queuedOnly) AskQueued(context.Context, string, string) (request.Found, bool, error) {
	return request.Found{Queued: request.Queued{AcceptedAt: time.Now()}, Seq: 7}, true, nil
}

// A waiting read of a queued request without a record (none until its first attempt,
// ADR 18) answers queued when its wait ends, as the queue said: it used to read the
// record again at the end of the wait, find nothing, and answer unknown.
func TestAWaitingReadOfAQueuedRequestStaysQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api, err := ingest.New(ingest.Config{Status: &queuedOnly{}}, stored{}, stored{}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		api.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/requests/"+request.NewID(time.Now())+"?clientId=olga&wait=10s", nil))
		var st request.Status
		if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || rec.Code != http.StatusOK || st.State != request.StateQueued {
			t.Fatalf("a waiting read of a queued request: %d %s, want 200 queued", rec.Code, rec.Body)
		}
	})
}
