package network

// Capacity is how many slots the pool's range holds in all.
func (p *Pool) Capacity() int { return p.cfg.capacity() }

// Free is how many more slots Acquire can hand out (warm ones included).
func (p *Pool) Free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	inUse := 0
	for _, st := range p.state {
		if st == stateInUse {
			inUse++
		}
	}
	return p.cfg.capacity() - inUse
}
