package freeport

import (
	"net"
	"strconv"
	"testing"
)

// Picked ports are below the ephemeral range, free, and never the same twice.
func TestLoopbackPicksBelowTheEphemeralRange(t *testing.T) {
	t.Parallel()
	low := ephemeralLow()
	seen := map[int]bool{}
	for range 20 {
		addr, err := Loopback()
		if err != nil {
			t.Fatal(err)
		}
		host, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		if host != "127.0.0.1" || port < base || port >= low {
			t.Fatalf("picked %s: want 127.0.0.1 and a port in [%d, %d)", addr, base, low)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("picked %s, which is not free: %v", addr, err)
		}
		ln.Close()
		seen[port] = true
	}
	if len(seen) != 20 {
		t.Fatalf("20 picks gave %d distinct ports, want 20: a process never gets a port twice", len(seen))
	}
}
