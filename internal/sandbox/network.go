package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/store"
)

// ParseNetwork validates a user's egress policy; nil means the default.
func ParseNetwork(p *store.NetworkPolicy) (network.Policy, error) {
	if p == nil {
		return network.DefaultPolicy(), nil
	}
	allow := p.AllowInternet
	pol, err := network.ParsePolicy(&allow, p.AllowOut, p.DenyOut)
	if err != nil {
		return network.Policy{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return pol, nil
}

// applyNetwork installs sb's egress policy on its slot.
func (m *Manager) applyNetwork(ctx context.Context, sb *store.Sandbox, slot *network.Slot) error {
	pol, err := ParseNetwork(sb.Network)
	if err != nil {
		return err
	}
	if err := m.slots.SetPolicy(ctx, slot.Index, pol); err != nil {
		return fmt.Errorf("egress policy of %s: %w", sb.ID, err)
	}
	return nil
}

// nameservers are the resolvers a sandbox's resolv.conf lists: the ones
// the network layer lets through its policy.
func (m *Manager) nameservers() []string {
	var out []string
	for _, a := range m.slots.DNSServers() {
		out = append(out, a.String())
	}
	return out
}

// UpdateNetwork changes the egress policy of a sandbox; new connections
// follow it at once. A paused sandbox gets it when it resumes.
func (m *Manager) UpdateNetwork(ctx context.Context, id string, p *store.NetworkPolicy) error {
	pol, err := ParseNetwork(p)
	if err != nil {
		return err
	}
	e, err := m.lookup(ctx, id)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	updated := cloneSandbox(e.sb)
	updated.Network = p
	updated.UpdatedAt = time.Now().UTC()
	if err := m.store.UpdateSandbox(ctx, updated); err != nil {
		return err
	}
	if e.slot != nil {
		if err := m.slots.SetPolicy(ctx, e.slot.Index, pol); err != nil {
			return fmt.Errorf("egress policy of %s: %w", id, err)
		}
	}
	e.sb = updated
	m.logger.InfoContext(ctx, "egress policy changed", "sandbox", id, "policy", pol.String())
	return nil
}

// NetworkCounters returns the bytes each running sandbox sent and
// received through its egress path, by sandbox ID.
func (m *Manager) NetworkCounters(ctx context.Context) (map[string]network.Traffic, error) {
	bySlot, err := m.slots.AllCounters(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]network.Traffic{}
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, e := range m.live {
		if e.slot == nil {
			continue
		}
		if tr, ok := bySlot[e.slot.Index]; ok {
			out[id] = tr
		}
	}
	return out, nil
}
