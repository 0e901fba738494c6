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
	if got, err := roundTrip(c, "one", time.Second); err != nil || got != "one\n" {
		t.Fatalf("pass: %q %v", got, err)
	}

	p.Blackhole()
	if _, err := roundTrip(c, "two", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("blackholed: %v, want a timeout", err)
	}
	p.Heal()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "two\n" {
		t.Fatalf("after heal, the held bytes: %q %v", line, err)
	}

	p.Delay(150 * time.Millisecond)
	start := time.Now()
	if got, err := roundTrip(c, "three", 2*time.Second); err != nil || got != "three\n" {
		t.Fatalf("delayed: %q %v", got, err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("a round trip through a 150ms delay each way took %s", took)
	}
	p.Heal()

	p.Refuse()
	if _, err := roundTrip(c, "four", time.Second); err == nil {
		t.Fatal("an open connection still works after Refuse")
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("a new connection was accepted after Refuse")
	}
	p.Heal()
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("after heal: %v", err)
	}
	defer c2.Close()
	if got, err := roundTrip(c2, "five", time.Second); err != nil || got != "five\n" {
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
	reset, _ := net.Dial("tcp", p.Addr())
	_, _ = reset.Write([]byte("reset"))
	closed, _ := net.Dial("tcp", p.Addr())
	_, _ = closed.Write([]byte("closed"))
	time.Sleep(50 * time.Millisecond)
	_ = reset.(*net.TCPConn).SetLinger(0)
	_ = reset.Close()
	_ = closed.Close()
	time.Sleep(50 * time.Millisecond)
	p.Heal()
	want := map[string]bool{"": true, "closed": true} // the reset one arrives empty
	for range 2 {
		select {
		case s := <-got:
			if !want[s] {
				t.Fatalf("the server read %q", s)
			}
			delete(want, s)
		case <-time.After(2 * time.Second):
			t.Fatalf("still waiting for %v", want)
		}
	}
}
