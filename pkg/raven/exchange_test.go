package raven_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// What a hostile raven found (2026-12-07): answers without an end, or without a bound.

// rawRaven listens on loopback and hands each connection, its request's head read, to
// answer; it counts the connections.
func rawRaven(t *testing.T, answer func(c net.Conn, r *bufio.Reader)) (url string, conns *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns = &atomic.Int32{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				r := bufio.NewReaderSize(c, 16) // reads little past the head
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if line == "\r\n" {
						break
					}
				}
				answer(c, r)
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/", conns
}

// stored is a request as the queue gives it to be sent.
func stored(id, client string, body []byte) request.Stored {
	return request.Stored{Request: request.Request{ID: id, ClientID: client, Body: body}}
}

// sendWithin sends one attempt and fails the test if it has not ended within limit.
func sendWithin(t *testing.T, c *raven.Client, st request.Stored, limit time.Duration) (*request.Response, error) {
	t.Helper()
	type result struct {
		answer *request.Response
		err    error
	}
	done := make(chan result, 1)
	go func() {
		a, err := c.SendAnswer(context.Background(), st, 1)
		done <- result{a, err}
	}()
	select {
	case r := <-done:
		return r.answer, r.err
	case <-time.After(limit):
		t.Fatalf("the attempt has not ended %s after it started (RAVEN_TIMEOUT is 1s)", limit)
		return nil, nil
	}
}

// An answer that switches protocols (101 with Upgrade) made net/http hand over the raw
// connection as the answer's body, which no timeout or cancel ends: the attempt stayed in
// flight for ever, its client's queue with it, and the dispatcher could not stop. It is
// raven's answer now, not one to read: a permanent failure, at once, its connection
// closed.
func TestASwitchOfProtocolsEndsTheAttempt(t *testing.T) {
	t.Parallel()
	closed := make(chan struct{})
	url, _ := rawRaven(t, func(c net.Conn, r *bufio.Reader) {
		_, _ = io.ReadFull(r, make([]byte, 2)) // the body, {}
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		_, _ = io.Copy(io.Discard, c) // held open until the dispatcher lets go
		close(closed)
	})
	c, err := raven.New(raven.Config{URL: url, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	answer, err := sendWithin(t, c, stored("u1", "up", []byte(`{}`)), 20*time.Second)
	var perm *request.PermanentError
	if !errors.As(err, &perm) || perm.Status != http.StatusSwitchingProtocols || answer == nil || answer.Status != http.StatusSwitchingProtocols {
		t.Fatalf("a 101 answer: %v (answer %+v), want a permanent failure with status 101", err, answer)
	}
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("the switched connection is still open 20s after the attempt ended")
	}
}

// net/http took up to 10 MiB of an answer's headers, held whole while the answer was
// read: 20 attempts at once held 1.45 GB. An answer with more than 1 MiB of headers is a
// broken answer now: "protocol", retried.
func TestAnswerHeadersAreBounded(t *testing.T) {
	t.Parallel()
	url, _ := rawRaven(t, func(c net.Conn, _ *bufio.Reader) {
		w := bufio.NewWriter(c)
		_, _ = w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n")
		for i := range 2 << 10 {
			_, _ = w.WriteString("X-Pad-" + strings.Repeat("p", 8) + string(rune('a'+i%26)) + ": " + strings.Repeat("x", 1000) + "\r\n")
		}
		_, _ = w.WriteString("\r\nok")
		_ = w.Flush()
		_, _ = io.Copy(io.Discard, c)
	})
	c, err := raven.New(raven.Config{URL: url, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sendWithin(t, c, stored("h1", "hdr", []byte(`{}`)), 30*time.Second)
	var tr *request.TransientError
	var se *raven.SendError
	if !errors.As(err, &tr) || !errors.As(err, &se) || se.Kind != raven.NoAnswerProtocol {
		t.Fatalf("an answer with 2 MiB of headers: %v, want a transient failure of kind %q", err, raven.NoAnswerProtocol)
	}
}

// Attempts one after another share one connection, answers with a body and without:
// what ends an exchange (the checks above) leaves ordinary ones alone.
func TestAttemptsKeepTheirConnection(t *testing.T) {
	t.Parallel()
	var news atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get(request.HeaderClientID) == "bodiless" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			news.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := raven.New(raven.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	for _, client := range []string{"keep", "bodiless"} {
		for i, body := range []string{"", "{}", strings.Repeat("x", 200<<10)} {
			for range 20 {
				if err := c.Send(context.Background(), stored("k", client, []byte(body)), 1); err != nil {
					t.Fatalf("%s, body %d: %v", client, i, err)
				}
			}
		}
	}
	if n := news.Load(); n != 1 {
		t.Errorf("120 attempts one after another opened %d connections, want 1", n)
	}
}
