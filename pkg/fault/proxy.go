// Package fault makes the faults that the tests and the soak command put the service
// through, on demand and undone on demand: a loopback TCP proxy between two parts of the
// service that refuses connections, stops every byte (a partition, or a peer that
// accepts and never reads), slows them down or resets them; and a full disk.
package fault

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Mode is what a Proxy does with connections.
type Mode int

// The modes.
const (
	// Pass forwards bytes both ways.
	Pass Mode = iota
	// Refuse closes the listener (new connections are refused) and resets every open
	// connection: a peer that is down.
	Refuse
	// Blackhole accepts connections but forwards nothing either way, on new and open
	// connections alike: a partition, or a peer that accepts and never reads. Bytes held
	// back flow after Heal, as TCP retransmits them, unless their connection was reset
	// meanwhile: then they are dropped and the reset passed on.
	Blackhole
)

// Proxy forwards TCP connections from its own loopback address to a target.
type Proxy struct {
	target string
	addr   string

	mu      sync.Mutex
	mode    Mode
	delay   time.Duration
	ln      net.Listener
	conns   map[*link]struct{}
	changed chan struct{} // closed and replaced whenever mode or delay changes
	closed  bool
}

// link is one proxied connection: its two ends.
type link struct{ client, server net.Conn }

// New listens on a free loopback port and forwards to target (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), ln: ln, conns: map[*link]struct{}{}, changed: make(chan struct{})}
	go p.accept(ln)
	return p, nil
}

// Addr is the proxy's address, host:port: point the client here.
func (p *Proxy) Addr() string { return p.addr }

// Target is where the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Mode says what the proxy does now.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Refuse makes the target look down: open connections are reset, new ones refused.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == Refuse {
		return
	}
	p.setMode(Refuse)
	p.shut()
}

// Blackhole stops every byte, on open connections and new ones, until Heal.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.relisten()
	p.setMode(Blackhole)
}

// Delay holds every chunk of bytes for d before forwarding it (0: no delay).
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
	p.setMode(p.mode)
}

// ResetAll resets every open connection (both ends see a reset) and keeps the mode.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resetConns()
}

// Heal undoes Refuse, Blackhole and Delay: bytes flow again, held ones first.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.relisten()
	p.delay = 0
	p.setMode(Pass)
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.shut()
	p.setMode(Refuse)
}

// shut closes the listener and resets every connection. p.mu is held.
func (p *Proxy) shut() {
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	p.resetConns()
}

// resetConns resets every open connection. p.mu is held.
func (p *Proxy) resetConns() {
	for l := range p.conns {
		l.reset()
		delete(p.conns, l)
	}
}

// setMode changes the mode and wakes every copier. p.mu is held.
func (p *Proxy) setMode(m Mode) {
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
}

// relisten opens the listener again after Refuse, on the same address. p.mu is held.
func (p *Proxy) relisten() {
	if p.ln != nil {
		return
	}
	var ln net.Listener
	var err error
	for range 50 { // the port may linger a moment after the close
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return // stays refusing; the caller's checks will say so
	}
	p.ln = ln
	go p.accept(ln)
}

func (p *Proxy) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		resetConn(c)
		return
	}
	l := &link{client: c, server: s}
	p.mu.Lock()
	if p.closed || p.mode == Refuse {
		p.mu.Unlock()
		l.reset()
		return
	}
	p.conns[l] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { p.pipe(s, c); done <- struct{}{} }()
	go func() { p.pipe(c, s); done <- struct{}{} }()
	<-done
	// One direction ended: end the other too. (No half-closed connections: neither HTTP
	// nor NATS needs them.)
	_ = c.Close()
	_ = s.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}

// pipe forwards src to dst. Bytes are read as they come, so that a reset or an end of
// src is seen at once, and written when the mode lets them through. A reset of src
// discards what was held and resets dst, as TCP does: bytes of a connection that was
// reset never reach the application on the other side. An end of src delivers what
// was held, then ends.
func (p *Proxy) pipe(dst, src net.Conn) {
	chunks := make(chan []byte, 64)
	wasReset := make(chan struct{})
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case chunks <- buf[:n]:
				case <-quit:
					return
				}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					close(wasReset)
				}
				return
			}
		}
	}()
	for {
		select {
		case <-wasReset:
			resetConn(dst)
			return
		case b, ok := <-chunks:
			if !ok {
				return
			}
			if !p.hold(wasReset) {
				resetConn(dst)
				return
			}
			if _, err := dst.Write(b); err != nil {
				return
			}
		}
	}
}

// hold waits until bytes may flow: not blackholed, and the delay served. It returns false
// when the bytes are to be dropped: the proxy refuses or is closed, or the connection
// they came on was reset.
func (p *Proxy) hold(wasReset <-chan struct{}) bool {
	slept := false
	for {
		// A reset already seen wins: woken by a Heal and a reset at once, a select
		// picks either, and the bytes of a reset connection would go through half the
		// time.
		select {
		case <-wasReset:
			return false
		default:
		}
		p.mu.Lock()
		mode, delay, changed := p.mode, p.delay, p.changed
		p.mu.Unlock()
		switch {
		case mode == Refuse:
			return false
		case mode == Blackhole:
			select {
			case <-changed:
			case <-wasReset:
				return false
			}
		case delay > 0 && !slept:
			slept = true
			select {
			case <-time.After(delay):
			case <-changed:
			case <-wasReset:
				return false
			}
		default:
			return true
		}
	}
}

func (l *link) reset() {
	resetConn(l.client)
	resetConn(l.server)
}

func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
