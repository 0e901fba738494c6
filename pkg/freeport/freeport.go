// Package freeport picks loopback ports for servers that tests and the soak start, stop
// and start again on the same port.
//
// A port from the kernel's ephemeral range (what listening on port 0 gives) can be handed
// to an outgoing connection, or to another listener on port 0, between the moment it was
// picked and the moment its server binds it (again, after a restart): the server then
// cannot start (a soak's node stopped at "address already in use"; a test cluster's node
// did not come back within its start bound), or a sender reaches a stranger. Below the
// range only another pick can take the port: picks are random among thousands, and one
// process never gets the same port twice.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

var (
	mu     sync.Mutex
	picked = map[int]bool{} // ports handed out by this process
)

// base is the lowest port picked: above the well-known and common service ports.
const base = 20000

// Loopback returns a loopback address ("127.0.0.1:port") whose port was free a moment
// ago, below the kernel's ephemeral range.
func Loopback() (string, error) {
	low := ephemeralLow()
	mu.Lock()
	defer mu.Unlock()
	for range 100 {
		port := base + rand.IntN(low-base)
		if picked[port] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		picked[port] = true
		return addr, nil
	}
	return "", fmt.Errorf("no free loopback port between %d and %d after 100 tries", base, low)
}

// Port is Loopback's port alone.
func Port() (int, error) {
	addr, err := Loopback()
	if err != nil {
		return 0, err
	}
	_, p, _ := net.SplitHostPort(addr)
	return strconv.Atoi(p)
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768, Linux's default,
// when it cannot be read or leaves no room below it).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if low, err := strconv.Atoi(f[0]); err == nil && low > base+1000 {
				return low
			}
		}
	}
	return 32768
}
