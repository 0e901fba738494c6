package cli

import (
	"net"
	"net/url"
	"strconv"
	"testing"
)

// URLFor gives the address a listener bound, every interface as such; LocalURL the one a
// client on this host dials: loopback for a listener on every interface.
func TestURLForIsTheAddressBound(t *testing.T) {
	for _, c := range []struct {
		addr           string
		everyInterface bool
	}{
		{"127.0.0.1:0", false},
		{":0", true},
		{"0.0.0.0:0", true},
	} {
		ln, err := net.Listen("tcp", c.addr)
		if err != nil {
			t.Fatal(err)
		}
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		bound, _ := url.Parse(URLFor(ln, "/x"))
		local, _ := url.Parse(LocalURL(ln, "/x"))
		ln.Close()
		if ip := net.ParseIP(bound.Hostname()); ip == nil || ip.IsUnspecified() != c.everyInterface || bound.Port() != port || bound.Path != "/x" {
			t.Errorf("%s: URLFor %s, want the address bound (port %s)", c.addr, bound, port)
		}
		if local.Hostname() != "127.0.0.1" || local.Port() != port || local.Path != "/x" {
			t.Errorf("%s: LocalURL %s, want 127.0.0.1:%s", c.addr, local, port)
		}
	}
}
