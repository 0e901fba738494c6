package cli

import (
	"bufio"
	"encoding/json"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/integration/itest"
)

// What net/http logs through Go's log package, here the line a raven that writes after
// its answer makes the client's transport log, is a JSON line of the service's logger,
// not plain text among the JSON ones.
func TestGoLogLinesAreJSON(t *testing.T) {
	t.Cleanup(func() { stdlog.SetOutput(os.Stderr); stdlog.SetFlags(stdlog.LstdFlags) })
	var out itest.Buffer
	(&Log{Level: "info", Format: "json"}).Logger(&out, "test")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // raven: answers, then writes a second answer nobody asked for
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		time.Sleep(100 * time.Millisecond)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
		time.Sleep(time.Second)
	}()
	client := &http.Client{Transport: &http.Transport{}}
	res, err := client.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()

	// A handler's recovered panic is an error: LOG_LEVEL=error still shows it.
	var errs itest.Buffer
	(&Log{Level: "error", Format: "json"}).Logger(&errs, "test")
	stdlog.Print("http: panic serving 127.0.0.1:1: boom\ngoroutine 1 [running]:")
	stdlog.Print("http: TLS handshake error from 127.0.0.1:1: EOF")
	if got := errs.String(); !strings.Contains(got, `"level":"error"`) || !strings.Contains(got, "panic serving") || strings.Contains(got, "handshake") {
		t.Errorf("at LOG_LEVEL=error: %q; want the panic as an error line and nothing else", got)
	}
	(&Log{Level: "info", Format: "json"}).Logger(&out, "test")

	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "Unsolicited response") {
		if time.Now().After(deadline) {
			t.Fatalf("no line about the unsolicited response in the service's log: %q", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("a log line is not JSON: %q", line)
		}
		if v["level"] != "warn" || v["component"] != "go" || v["service"] != "test" || !strings.HasPrefix(v["message"].(string), "Unsolicited response") {
			t.Errorf("line %q: want a warning of component go from service test", line)
		}
	}
}
