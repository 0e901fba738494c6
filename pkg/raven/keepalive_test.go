package raven_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// The dispatcher lets an idle connection go before raven does (RAVEN_IDLE_TIMEOUT below
// raven's idle timeout): the next attempt after a pause opens a new connection rather
// than take one raven may be closing at that moment. Raven here keeps idle connections
// a minute; the client, 20 ms; an attempt a second after the first goes on a new one.
func TestIdleConnectionsAreLetGoBeforeRavens(t *testing.T) {
	t.Parallel()
	var opened atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	srv.Config.IdleTimeout = time.Minute
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	st := request.Stored{Request: request.Request{ID: "id1", ClientID: "alice", Body: []byte(`{}`)}}
	for _, idle := range []time.Duration{20 * time.Millisecond, time.Minute} {
		opened.Store(0)
		c, err := raven.New(raven.Config{URL: srv.URL, IdleTimeout: idle})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if err := c.Send(context.Background(), st, i+1); err != nil {
				t.Fatalf("attempt %d: %v", i+1, err)
			}
			time.Sleep(time.Second)
		}
		want := int32(2)
		if idle == time.Minute {
			want = 1 // the control: kept as long as raven keeps it, the connection is reused
		}
		if got := opened.Load(); got != want {
			t.Fatalf("idle timeout %s: two attempts a second apart opened %d connections, want %d", idle, got, want)
		}
	}
	if raven.DefaultIdleTimeout >= 2*time.Second {
		t.Fatalf("RAVEN_IDLE_TIMEOUT's default %s is not below gunicorn's 2 s", raven.DefaultIdleTimeout)
	}
}

// wire is a transport that fails each exchange as its script says: on a kept
// connection before a byte was written (raven closed it as idle), or after the request
// was written (raven may have acted), and answers 200 once the script is done.
type wire struct {
	script []string // "unsent", "sent", "fresh-unsent", "slow-unsent" (after 800 ms), "hang" (until the attempt ends)
	calls  atomic.Int32
}

func (w *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	n := int(w.calls.Add(1))
	trace := httptrace.ContextClientTrace(r.Context())
	if n > len(w.script) {
		trace.GotConn(httptrace.GotConnInfo{})
		trace.WroteHeaders()
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
	}
	switch w.script[n-1] {
	case "unsent":
		trace.GotConn(httptrace.GotConnInfo{Reused: true})
	case "fresh-unsent":
		trace.GotConn(httptrace.GotConnInfo{})
	case "sent":
		trace.GotConn(httptrace.GotConnInfo{Reused: true})
		trace.WroteHeaders()
	case "slow-unsent":
		time.Sleep(800 * time.Millisecond)
		trace.GotConn(httptrace.GotConnInfo{Reused: true})
	case "hang":
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return nil, errors.New("read: connection reset by peer")
}

// An attempt that failed on a kept connection before it wrote a byte reached no one:
// it is sent again at once, once, within the same attempt. One that wrote its request, or
// failed on a connection of its own (nothing to gain from the same again at once), is the
// attempt's failure, for the scheduler to space.
func TestAnAttemptThatWroteNothingIsSentAgainAtOnce(t *testing.T) {
	t.Parallel()
	st := request.Stored{Request: request.Request{ID: "id1", ClientID: "alice", Body: []byte(`{}`)}}
	for _, c := range []struct {
		script []string
		ok     bool
		calls  int32
	}{
		{[]string{"unsent"}, true, 2},
		{[]string{"unsent", "unsent"}, false, 2},
		{[]string{"sent"}, false, 1},
		{[]string{"fresh-unsent"}, false, 1},
	} {
		w := &wire{script: c.script}
		cl, err := raven.New(raven.Config{URL: "http://raven.invalid/hook", Transport: w})
		if err != nil {
			t.Fatal(err)
		}
		err = cl.Send(context.Background(), st, 1)
		var tr *request.TransientError
		if c.ok && err != nil || !c.ok && !errors.As(err, &tr) || w.calls.Load() != c.calls {
			t.Errorf("%v: %v after %d exchanges; want success %v after %d", c.script, err, w.calls.Load(), c.ok, c.calls)
		}
	}
}

// The resend is part of the attempt, not a second one: the two together end within one
// RAVEN_TIMEOUT, which the leases' margin counts on (an owner stops starting sends
// RAVEN_TIMEOUT before its lease may lapse). Here the first exchange fails unsent after
// 800 ms of a 1 s timeout and the resend hangs: the attempt ends at 1 s, not 1.8 s. (In a
// synctest bubble: the time taken is exact.)
func TestTheResendEndsWithinTheAttemptsTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := request.Stored{Request: request.Request{ID: "id1", ClientID: "alice", Body: []byte(`{}`)}}
		w := &wire{script: []string{"slow-unsent", "hang"}}
		cl, err := raven.New(raven.Config{URL: "http://raven.invalid/hook", Timeout: time.Second, Transport: w})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var tr *request.TransientError
		if err := cl.Send(context.Background(), st, 1); !errors.As(err, &tr) || w.calls.Load() != 2 {
			t.Fatalf("%v after %d exchanges, want a transient failure after 2", err, w.calls.Load())
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("the attempt and its resend took %s, more than RAVEN_TIMEOUT (1s)", took)
		}
	})
}
