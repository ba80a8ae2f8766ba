package sandbox

import "sync"

// Use is what a node holds, for its cluster heartbeat and admission.
type Use struct {
	Sandboxes int // running, paused in memory or starting
	Starting  int // of those, still starting
	MemoryMB  int // memory given to them
}

func (u Use) plus(d Use) Use {
	return Use{Sandboxes: u.Sandboxes + d.Sandboxes, Starting: u.Starting + d.Starting, MemoryMB: u.MemoryMB + d.MemoryMB}
}

func (u Use) minus(d Use) Use {
	return Use{Sandboxes: u.Sandboxes - d.Sandboxes, Starting: u.Starting - d.Starting, MemoryMB: u.MemoryMB - d.MemoryMB}
}

// use is a sandbox's share of its node's Use: a sandbox paused to disk
// holds no memory and counts for nothing.
func (v *view) use() Use {
	if v == nil || v.phase == phaseOnDisk {
		return Use{}
	}
	u := Use{Sandboxes: 1}
	if v.phase == phaseStarting {
		u.Starting = 1
	}
	if v.sb != nil {
		u.MemoryMB = v.sb.MemoryMB
	}
	return u
}

// tally is the sum of the shares of the live entries' views, kept as
// entries are registered, publish new views and are unregistered, so that
// Use (asked by admission at every create) need not walk them.
type tally struct {
	mu sync.Mutex // a leaf lock: taken under Manager.mu, never the reverse
	u  Use
}

// Use reports what the node holds, in constant time and without waiting
// for any lifecycle operation.
func (m *Manager) Use() Use {
	m.tally.mu.Lock()
	defer m.tally.mu.Unlock()
	return m.tally.u
}

// swap makes v the entry's view and moves the entry's share of the tally
// from the old view to v in one step, so that Use never counts a sandbox
// twice or misses it.
func (e *entry) swap(v *view) *view {
	t := e.tally
	if t == nil {
		// Not registered yet: register counts the view it finds.
		return e.cur.Swap(v)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := e.cur.Swap(v)
	if e.counted {
		t.u = t.u.minus(old.use()).plus(v.use())
	}
	return old
}

// count adds e's share to the tally, or with add false takes it away;
// Manager.mu must be held, so that the count follows the live set.
func (m *Manager) count(e *entry, add bool) {
	m.tally.mu.Lock()
	defer m.tally.mu.Unlock()
	if e.counted == add {
		return
	}
	e.counted = add
	if add {
		m.tally.u = m.tally.u.plus(e.view().use())
	} else {
		m.tally.u = m.tally.u.minus(e.view().use())
	}
}

// Size is what a sandbox was given, and its team.
type Size struct {
	MemoryMB, VCPUs int
	TeamID          string
}

// SandboxSize is the size and team of a sandbox this node holds, in any
// phase (paused to disk too), read from its entry rather than the store:
// false when the node holds no such sandbox.
func (m *Manager) SandboxSize(id string) (Size, bool) {
	e := m.entry(id)
	if e == nil {
		return Size{}, false
	}
	v := e.view()
	if v.phase == phaseGone {
		return Size{}, false
	}
	return Size{MemoryMB: v.sb.MemoryMB, VCPUs: v.sb.VCPU, TeamID: v.sb.TeamID}, true
}
