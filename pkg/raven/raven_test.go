package raven_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/fault"
	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		status     int
		retryAfter string
		permanent  bool
		transient  bool
		after      time.Duration
	}{
		{200, "", false, false, 0}, {204, "", false, false, 0},
		{400, "", true, false, 0}, {404, "", true, false, 0}, {409, "", true, false, 0}, {302, "", true, false, 0},
		{408, "", false, true, 0}, {425, "", false, true, 0}, {429, "7", false, true, 7 * time.Second},
		{500, "", false, true, 0}, {503, "Thu, 01 Jan 2026 00:00:30 GMT", false, true, 30 * time.Second},
		{503, "-5", false, true, 0}, {503, "soon", false, true, 0},
		{600, "", false, true, 0}, {999, "", false, true, 0}, // no HTTP status: as a failing raven (README)
	}
	for _, c := range cases {
		err := raven.Classify(c.status, c.retryAfter, now)
		var p *request.PermanentError
		var tr *request.TransientError
		if errors.As(err, &p) != c.permanent || errors.As(err, &tr) != c.transient {
			t.Errorf("%d: %v, want permanent=%v transient=%v", c.status, err, c.permanent, c.transient)
		}
		if tr != nil && tr.After != c.after {
			t.Errorf("%d Retry-After %q: %s, want %s", c.status, c.retryAfter, tr.After, c.after)
		}
	}
}

func TestSendHeadersAndRedirects(t *testing.T) {
	t.Parallel()
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moved" {
			http.Redirect(w, r, "http://example.invalid/", http.StatusFound)
			return
		}
		got = r.Header.Clone()
	}))
	defer srv.Close()
	c, err := raven.New(raven.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	st := request.Stored{Request: request.Request{ID: "id1", ClientID: "a.b", ContentType: "application/json", Body: []byte("{}")}}
	if err := c.Send(context.Background(), st, 3); err != nil {
		t.Fatal(err)
	}
	if got.Get("Idempotency-Key") != "id1" || got.Get("X-Client-Id") != "a.b" || got.Get("X-Dispatch-Attempt") != "3" || got.Get("Content-Type") != "application/json" {
		t.Fatalf("headers %v", got)
	}
	moved, _ := raven.New(raven.Config{URL: srv.URL + "/moved"})
	var p *request.PermanentError
	if err := moved.Send(context.Background(), st, 1); !errors.As(err, &p) || p.Status != http.StatusFound {
		t.Fatalf("redirect: %v, want a permanent failure with status 302 (not followed)", err)
	}
	if _, err := raven.New(raven.Config{URL: "ftp://x"}); err == nil {
		t.Fatal("an ftp URL was accepted")
	}
}

// dropServer answers 204, except that a request for which drop says so is read whole
// and then its connection is closed without an answer. It counts the requests that
// arrived, and numbers each one within its connection (1 for a connection's first).
func dropServer(t testing.TB, drop func(onConn int) bool) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var arrivals atomic.Int32
	type connKey struct{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrivals.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		n := r.Context().Value(connKey{}).(*atomic.Int32).Add(1)
		if !drop(int(n)) {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		_ = conn.Close()
	}))
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, new(atomic.Int32))
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &arrivals
}

// A connection closed after the request was read, with no answer, is one failed attempt:
// the client must not send the request again by itself, neither on a reused keep-alive
// connection (where net/http would, for a POST with an Idempotency-Key) nor on a fresh
// one (G2, G5: every attempt is one exchange the dispatcher spaces and counts).
func TestDroppedConnectionIsOneAttempt(t *testing.T) {
	t.Parallel()
	st := request.Stored{Request: request.Request{ID: "id1", ClientID: "alice", ContentType: "application/json", Body: []byte(`{"n":1}`)}}
	t.Run("ReusedConnection", func(t *testing.T) {
		t.Parallel()
		srv, arrivals := dropServer(t, func(onConn int) bool { return onConn > 1 })
		c, err := raven.New(raven.Config{URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		// Each round: an answered request opens a connection, and the next one reuses it
		// and is dropped.
		for round := 1; round <= 3; round++ {
			if err := c.Send(context.Background(), st, 2*round-1); err != nil {
				t.Fatalf("round %d, answered attempt: %v", round, err)
			}
			var tr *request.TransientError
			if err := c.Send(context.Background(), st, 2*round); !errors.As(err, &tr) {
				t.Fatalf("round %d, attempt on a dropped reused connection: %v, want a transient failure", round, err)
			}
			if got := int(arrivals.Load()); got != 2*round {
				t.Fatalf("after %d attempts raven saw %d requests: the client sent one again by itself", 2*round, got)
			}
		}
	})
	t.Run("FreshConnection", func(t *testing.T) {
		t.Parallel()
		srv, arrivals := dropServer(t, func(int) bool { return true })
		c, err := raven.New(raven.Config{URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		var tr *request.TransientError
		if err := c.Send(context.Background(), st, 1); !errors.As(err, &tr) {
			t.Fatalf("dropped connection: %v, want a transient failure", err)
		}
		if got := arrivals.Load(); got != 1 {
			t.Fatalf("raven saw %d requests for one attempt", got)
		}
	})
	t.Run("HTTP2", func(t *testing.T) {
		t.Parallel()
		var arrivals atomic.Int32
		var srv *httptest.Server
		srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := arrivals.Add(1)
			_, _ = io.Copy(io.Discard, r.Body)
			if r.ProtoMajor != 2 {
				t.Errorf("request over %s, want HTTP/2", r.Proto)
			}
			if n > 1 {
				srv.CloseClientConnections() // the whole request read, then the connection goes
				return
			}
			w.WriteHeader(http.StatusNoContent)
		}))
		srv.EnableHTTP2 = true
		srv.StartTLS()
		t.Cleanup(srv.Close)
		c, err := raven.New(raven.Config{URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		raven.TrustForTest(c, srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs)
		if err := c.Send(context.Background(), st, 1); err != nil {
			t.Fatalf("first attempt: %v", err)
		}
		var tr *request.TransientError
		if err := c.Send(context.Background(), st, 2); !errors.As(err, &tr) {
			t.Fatalf("dropped HTTP/2 connection: %v, want a transient failure", err)
		}
		if got := arrivals.Load(); got != 2 {
			t.Fatalf("raven saw %d requests for 2 attempts", got)
		}
	})
}

// An attempt that times out while a partition holds its bytes back must not reach raven
// when the partition heals: the client resets the connection it gives up on, so its
// kernel stops retransmitting the request. (Closed normally, the request and a FIN would
// be delivered after the heal, and raven would act on an attempt the dispatcher had
// already counted failed.) The proxy drops what it holds of a connection reset on its
// client side, as the network does.
func TestTimedOutAttemptDoesNotArriveAfterAPartitionHeals(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var arrived []string // the ids raven received, in order
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived = append(arrived, r.Header.Get(request.HeaderIdempotencyKey))
		mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	// The proxy lets go of raven's side of a connection once it has seen the client's
	// side reset, and drops the bytes it held of it: from then on nothing of it can
	// arrive. (A connection closed normally it would hold, bytes and all, until Heal.)
	let := make(chan struct{}, 8)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			select {
			case let <- struct{}{}:
			default:
			}
		}
	}
	srv.Start()
	defer srv.Close()
	p, err := fault.New(strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// The attempt's timeout is short, and only a broken client would get through a
	// partition in it: a loaded machine times out all the same.
	c, err := raven.New(raven.Config{URL: "http://" + p.Addr(), Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st := request.Stored{Request: request.Request{ID: "id1", ClientID: "alice", Body: []byte(`{}`)}}
	p.Blackhole()
	var tr *request.TransientError
	if err := c.Send(context.Background(), st, 1); !errors.As(err, &tr) {
		t.Fatalf("through a partition: %v, want a transient failure", err)
	}
	select {
	case <-let:
	case <-time.After(10 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("10 s after the attempt timed out, the proxy still holds its connection to raven (arrived so far: %q): "+
			"the client did not reset it, and it would arrive after the heal", arrived)
	}
	p.Heal()
	// One more attempt after the heal, by a client with time to spare: raven receives
	// it, and nothing else.
	sentinel, err := raven.New(raven.Config{URL: "http://" + p.Addr(), Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := sentinel.Send(context.Background(), request.Stored{Request: request.Request{ID: "id2", ClientID: "alice", Body: []byte(`{}`)}}, 1); err != nil {
		t.Fatalf("an attempt after the heal: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(arrived) != 1 || arrived[0] != "id2" {
		t.Fatalf("raven received %q, want only the attempt made after the heal, id2", arrived)
	}
}

// An empty body is no exception: net/http takes a request with http.NoBody for
// replayable, and would resend it after a dropped reused connection.
func TestEmptyBodyIsOneAttemptToo(t *testing.T) {
	t.Parallel()
	srv, arrivals := dropServer(t, func(onConn int) bool { return onConn > 1 })
	c, err := raven.New(raven.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	st := request.Stored{Request: request.Request{ID: "id1", ClientID: "alice"}}
	if err := c.Send(context.Background(), st, 1); err != nil {
		t.Fatalf("first attempt: %v", err)
	}
	var tr *request.TransientError
	if err := c.Send(context.Background(), st, 2); !errors.As(err, &tr) {
		t.Fatalf("attempt on a dropped reused connection: %v, want a transient failure", err)
	}
	if got := arrivals.Load(); got != 2 {
		t.Fatalf("raven saw %d requests for 2 attempts", got)
	}
}

// An exchange without an answer is recorded as a word from a fixed vocabulary, never
// with raven's URL: the URL may carry credentials and a key, and the error's text reaches
// penguin's status reads, the events, dead letters and logs (issue 35, finding 4). Each
// failure is made for real: nothing listening, a connection reset mid-exchange, an answer
// that is not HTTP, no answer in time, a TLS server with a certificate nobody trusts.
func TestNoAnswerIsAWordNeverTheURL(t *testing.T) {
	t.Parallel()
	const secrets = "svcuser:s3cret-pw@"
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	// A listener that takes each connection and answers as told.
	serve := func(answer func(net.Conn)) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go answer(c)
			}
		}()
		return ln.Addr().String()
	}
	readRequest := func(c net.Conn) { _, _ = c.Read(make([]byte, 4096)) }
	reset := serve(func(c net.Conn) {
		readRequest(c)
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	garbage := serve(func(c net.Conn) {
		readRequest(c)
		_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n\r\n"))
		c.Close()
	})
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	silent := serve(func(c net.Conn) {
		readRequest(c)
		<-hold
		c.Close()
	})
	untrusted := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(untrusted.Close)

	cases := []struct {
		url, kind string
		timeout   time.Duration
	}{
		{"http://" + secrets + closedAddr + "/hook?api_key=SECRET", raven.NoAnswerRefused, 5 * time.Second},
		{"http://" + secrets + reset + "/hook?api_key=SECRET", raven.NoAnswerReset, 5 * time.Second},
		{"http://" + secrets + garbage + "/hook?api_key=SECRET", raven.NoAnswerProtocol, 5 * time.Second},
		{"http://" + secrets + silent + "/hook?api_key=SECRET", raven.NoAnswerTimeout, 300 * time.Millisecond},
		{strings.Replace(untrusted.URL, "https://", "https://"+secrets, 1) + "/hook?api_key=SECRET", raven.NoAnswerTLS, 5 * time.Second},
	}
	for _, c := range cases {
		rc, err := raven.New(raven.Config{URL: c.url, Timeout: c.timeout})
		if err != nil {
			t.Fatal(err)
		}
		answer, err := rc.SendAnswer(context.Background(), request.Stored{Request: request.Request{ID: "r1", ClientID: "bob", Body: []byte("{}")}}, 1)
		var se *raven.SendError
		if answer != nil || !errors.As(err, &se) {
			t.Errorf("%s: %+v %v, want no answer", c.kind, answer, err)
			continue
		}
		if se.Kind != c.kind {
			t.Errorf("recorded %q, want %q (cause: %v)", se.Kind, c.kind, errors.Unwrap(se))
		}
		// What reads the logs to explain a duplicate (a timed-out attempt raven may
		// have acted on) tells a timeout from the text alone.
		if raven.TimedOutText(err.Error()) != (c.kind == raven.NoAnswerTimeout) {
			t.Errorf("%s: TimedOutText(%q) = %v", c.kind, err.Error(), raven.TimedOutText(err.Error()))
		}
		// The dispatcher counts a timeout as raven overloaded by the shared word.
		if errors.Is(err, request.ErrNoAnswerInTime) != (c.kind == raven.NoAnswerTimeout) {
			t.Errorf("%s: errors.Is(err, request.ErrNoAnswerInTime) = %v", c.kind, !(c.kind == raven.NoAnswerTimeout))
		}
		for _, text := range []string{err.Error(), fmt.Sprint(errors.Unwrap(se)), fmt.Sprintf("%+v", err)} {
			if strings.Contains(text, "SECRET") || strings.Contains(text, "s3cret") || strings.Contains(text, "svcuser") || strings.Contains(text, "/hook") {
				t.Errorf("%s: the error's text carries the URL: %s", c.kind, text)
			}
		}
	}
}
