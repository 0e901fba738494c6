package fault_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/fault"
)

// echoServer answers every line with the same line.
func echoServer(t testing.TB) string {
	t.Helper()
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
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string, wait time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return line, err
}

// Waits on the loopback are 10 s: a loaded machine may take long, and only a broken
// proxy takes that long. Two checks are shorter, and only a broken proxy fails them on a
// slow machine: the blackholed round trip must time out (200 ms: a slow machine makes it
// time out all the more), and the delayed round trip must take at least its two delays
// (a slow machine makes it take longer, not shorter).
func TestProxyModes(t *testing.T) {
	t.Parallel()
	p, err := fault.New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "one", 10*time.Second); err != nil || got != "one\n" {
		t.Fatalf("pass: %q %v", got, err)
	}

	p.Blackhole()
	if _, err := roundTrip(c, "two", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("blackholed: %v, want a timeout", err)
	}
	p.Heal()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "two\n" {
		t.Fatalf("after heal, the held bytes: %q %v", line, err)
	}

	p.Delay(150 * time.Millisecond)
	start := time.Now()
	if got, err := roundTrip(c, "three", 10*time.Second); err != nil || got != "three\n" {
		t.Fatalf("delayed: %q %v", got, err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("a round trip through a 150ms delay each way took %s", took)
	}
	p.Heal()

	p.Refuse()
	if got, err := roundTrip(c, "four", 10*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("an open connection after Refuse: %q %v, want it reset", got, err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), 10*time.Second); err == nil {
		t.Fatal("a new connection was accepted after Refuse")
	}
	p.Heal()
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("after heal: %v", err)
	}
	defer c2.Close()
	if got, err := roundTrip(c2, "five", 10*time.Second); err != nil || got != "five\n" {
		t.Fatalf("after heal: %q %v", got, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Bytes held by a blackhole are dropped when their connection is reset, and delivered
// when it is closed normally, as TCP would.
func TestBlackholeAndClose(t *testing.T) {
	t.Parallel()
	got := make(chan string, 4)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { b, _ := io.ReadAll(c); got <- string(b); c.Close() }()
		}
	}()
	p, err := fault.New(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Blackhole()
	reset, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer reset.Close()
	_, _ = reset.Write([]byte("reset"))
	closed, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer closed.Close()
	_, _ = closed.Write([]byte("closed"))
	// Both connections reach the server before either ends: a connection reset before
	// the proxy took it would never reach the server at all.
	waitLinks(t, p, 2, "both connections proxied")
	_ = reset.(*net.TCPConn).SetLinger(0)
	_ = reset.Close()
	_ = closed.Close()
	// The proxy has seen the reset once it let go of that connection; the closed one it
	// holds until Heal, with its bytes.
	waitLinks(t, p, 1, "the reset connection dropped")
	p.Heal()
	want := map[string]bool{"": true, "closed": true} // the reset one arrives empty
	for range 2 {
		select {
		case s := <-got:
			if !want[s] {
				t.Fatalf("the server read %q", s)
			}
			delete(want, s)
		case <-time.After(10 * time.Second):
			t.Fatalf("still waiting for %v", want)
		}
	}
}

// waitLinks waits until p holds n connections, 10 s at most.
func waitLinks(t testing.TB, p *fault.Proxy, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.Links() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the proxy holds %d connections after 10 s, want %d", what, p.Links(), n)
		}
		time.Sleep(time.Millisecond)
	}
}
