package ledger

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// When raven drops or resets a connection, the exchange ended when raven let go: the
// end it records is never later than the moment the sender saw the connection end. (It
// was taken after the close returned, up to milliseconds after the sender had seen it,
// and the soak counted the next attempt's gap as below the interval.)
func TestDroppedExchangeEndsBeforeTheSenderSeesIt(t *testing.T) {
	for _, fault := range []Fault{Drop, Reset} {
		l := New(Options{Respond: func(Arrival) Response { return Response{Fault: fault} }})
		srv := httptest.NewServer(l)
		var seen []time.Time
		for i := range 200 {
			req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
			req.Header.Set("X-Client-Id", "c")
			req.Header.Set("Idempotency-Key", strconv.Itoa(i))
			tr := &http.Transport{DisableKeepAlives: true}
			_, err := (&http.Client{Transport: tr}).Do(req)
			seen = append(seen, time.Now())
			if err == nil {
				t.Fatalf("fault %d: the request got an answer", fault)
			}
		}
		srv.Close()
		late := 0
		for _, a := range l.Arrivals() {
			n, _ := strconv.Atoi(a.ID)
			if a.End.After(seen[n]) {
				late++
			}
		}
		if late > 0 {
			t.Errorf("fault %d: %d of 200 exchanges recorded as ending after the sender saw them end", fault, late)
		}
	}
}
