package fault

// Links is how many connections p holds open now.
func (p *Proxy) Links() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}
