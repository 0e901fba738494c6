package raven

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
)

// What ends one exchange with raven on the wire, whatever raven does: an answer that
// comes before raven has the whole request, and an answer that switches protocols.

// sentBody is an attempt's body that knows whether the transport has taken all of it:
// net/http reads a body to its end before it flushes the request's last bytes, so a body
// not read to its end when the answer comes means raven answered before it had the whole
// request.
type sentBody struct {
	r    *bytes.Reader
	done atomic.Bool
}

func (b *sentBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil {
		b.done.Store(true)
	}
	return n, err
}

// WriteTo is bytes.Reader's, which net/http copies a body with when it can.
func (b *sentBody) WriteTo(w io.Writer) (int64, error) {
	n, err := b.r.WriteTo(w)
	if err == nil {
		b.done.Store(true)
	}
	return n, err
}

func (*sentBody) Close() error { return nil }

// exchangeConn is the connection an attempt went out on, as the transport reports it.
type exchangeConn struct {
	mu   sync.Mutex
	conn net.Conn
}

// trace has ctx report the attempt's connection to c.
func (c *exchangeConn) trace(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		c.mu.Lock()
		c.conn = info.Conn
		c.mu.Unlock()
	}})
}

// unsent says whether raven's host has not received all that was written on the
// connection (Linux: the kernel's send queue).
func (c *exchangeConn) unsent() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn != nil && unsent(c.conn) > 0
}

// reset closes the connection, which resets it (New sets no linger): the kernel drops
// what it had not sent yet, and the connection carries no other attempt.
func (c *exchangeConn) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		_ = c.conn.Close()
	}
}
