package sandbox

// Use is what a node holds, for its cluster heartbeat and admission.
type Use struct {
	Sandboxes int // running, paused in memory or starting
	Starting  int // of those, still starting
	MemoryMB  int // memory given to them
}

// Use counts the sandboxes that hold memory (a sandbox paused to disk
// holds none) from their published views; it takes no lifecycle lock.
func (m *Manager) Use() Use {
	var u Use
	for _, e := range m.entries() {
		v := e.cur.Load()
		if v == nil || v.phase == phaseOnDisk {
			continue
		}
		u.Sandboxes++
		if v.phase == phaseStarting {
			u.Starting++
		}
		if v.sb != nil {
			u.MemoryMB += v.sb.MemoryMB
		}
	}
	return u
}
