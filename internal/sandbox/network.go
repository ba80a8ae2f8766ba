package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/aenv-dev/aenv/internal/egress"
	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/node"
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
		return network.Policy{}, fmt.Errorf("%w: %v", node.ErrInvalid, err)
	}
	if e := p.EgressProxy; e != nil {
		if pol.Upstream, err = network.ParseUpstream(e.Address, e.Username, e.Password); err != nil {
			return network.Policy{}, fmt.Errorf("%w: %v", node.ErrInvalid, err)
		}
	}
	if len(p.Rules) > 0 {
		if pol.Rules, err = network.ParseRules(ruleHeaders(p.Rules)); err != nil {
			return network.Policy{}, fmt.Errorf("%w: %v", node.ErrInvalid, err)
		}
	}
	return pol, nil
}

// ruleHeaders is rules as network.ParseRules takes them: each host's
// transforms' header sets, in order.
func ruleHeaders(rules map[string][]store.NetworkRule) map[string][]map[string]string {
	out := make(map[string][]map[string]string, len(rules))
	for host, rs := range rules {
		sets := []map[string]string{}
		for _, r := range rs {
			if r.Transform != nil && len(r.Transform.Headers) > 0 {
				sets = append(sets, r.Transform.Headers)
			}
		}
		out[host] = sets
	}
	return out
}

// checkUpstream refuses a policy whose upstream proxy cannot be used,
// before anything is made or changed.
func (m *Manager) checkUpstream(ctx context.Context, pol network.Policy) error {
	if pol.Upstream == nil {
		return nil
	}
	if m.cfg.Egress == nil {
		return fmt.Errorf("%w: this node has no egress gateway for an egress proxy", node.ErrInvalid)
	}
	if err := m.cfg.Egress.CheckUpstream(ctx, *pol.Upstream); err != nil {
		return fmt.Errorf("%w: %v", node.ErrInvalid, err)
	}
	return nil
}

// applyNetwork installs sb's egress policy on its slot.
func (m *Manager) applyNetwork(ctx context.Context, sb *store.Sandbox, slot *network.Slot) error {
	pol, err := ParseNetwork(sb.Network)
	if err != nil {
		return err
	}
	pol.Team = sb.TeamID
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

// EgressLog returns the egress gateway's log of a sandbox, oldest first:
// empty while it holds no network slot (paused on disk) or has nothing
// logged.
func (m *Manager) EgressLog(ctx context.Context, id string) ([]egress.Event, error) {
	e := m.entry(id)
	if e == nil {
		if _, err := m.Get(ctx, id); err != nil {
			return nil, err
		}
		return nil, nil
	}
	v := e.view()
	if v.slot == nil || m.cfg.Egress == nil {
		return nil, nil
	}
	return m.cfg.Egress.Events(v.slot.Index), nil
}

// UpdateNetwork changes the egress policy of a sandbox; new connections
// follow it at once. A paused sandbox gets it when it resumes.
func (m *Manager) UpdateNetwork(ctx context.Context, id string, p *store.NetworkPolicy) error {
	pol, err := ParseNetwork(p)
	if err != nil {
		return err
	}
	if err := m.checkUpstream(ctx, pol); err != nil {
		return err
	}
	e, err := m.lock(ctx, id, opUpdateNetwork)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	v := e.view()
	updated, err := e.next(v.phase)
	if err != nil {
		return err
	}
	updated.Network = p
	pol.Team = v.sb.TeamID
	if v.phase == phaseRunning {
		// Before the rules (and their record): a connection they
		// intercept must find the CA trusted. (Environment variables are
		// set at create only: give rules then for runtimes that keep
		// their own roots.) A sandbox paused now gets it at its resume.
		if err := m.trustEgressCA(ctx, v.envd, updated); err != nil {
			return err
		}
	}
	if err := m.store.UpdateSandbox(ctx, updated); err != nil {
		return storeError("record network policy", err)
	}
	if v.slot != nil {
		if err := m.slots.SetPolicy(ctx, v.slot.Index, pol); err != nil {
			// Not acknowledged: the record goes back to the policy the
			// firewall still enforces.
			if rerr := m.store.UpdateSandbox(context.WithoutCancel(ctx), v.sb); rerr != nil {
				m.logger.ErrorContext(ctx, "restore network record", "sandbox", id, "err", rerr)
			}
			return fmt.Errorf("egress policy of %s: %w", id, err)
		}
	}
	e.transition(v.phase, updated, v.slot, v.envd, nil)
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
	for _, e := range m.entries() {
		v := e.view()
		if v.slot == nil || v.phase == phaseGone {
			continue
		}
		if tr, ok := bySlot[v.slot.Index]; ok {
			out[e.id] = tr
		}
	}
	return out, nil
}

// Where a sandbox whose policy has rules finds the node's egress CA: its
// own file, and the system bundle (Debian's and Alpine's path) it is
// added to, which OpenSSL, curl and Python's ssl read.
const (
	egressCAFile = "/usr/local/share/ca-certificates/aenv-egress-ca.crt"
	systemBundle = "/etc/ssl/certs/ca-certificates.crt"
)

// otherBundles are where other distributions keep their roots (Fedora and
// RHEL, openSUSE, Alpine's and the BSDs' link): an image without Debian's
// bundle gets one made from the first of them, so that the variables
// pointing at it still find every root, not the egress CA alone.
var otherBundles = []string{"/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem"}

// intercepted says whether sb's connections may be intercepted: its
// policy has header transforms, and the node has a gateway to apply them.
func (m *Manager) intercepted(sb *store.Sandbox) bool {
	return sb.Network != nil && len(sb.Network.Rules) > 0 && m.cfg.Egress != nil
}

// maxBundleBytes bounds the CA bundle read from a sandbox (its own file,
// which it may grow): Debian's is a quarter of a MiB.
const maxBundleBytes = 8 << 20

// readSandboxFile returns a file of the sandbox, nil if it has none, and
// an error past max bytes.
func readSandboxFile(ctx context.Context, envd *envdclient.Client, path string, max int64) ([]byte, error) {
	rc, _, err := envd.ReadFile(ctx, path, "root")
	if errors.Is(err, envdclient.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s in the sandbox: %w", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err == nil && int64(len(b)) > max {
		err = fmt.Errorf("%s in the sandbox is larger than %d bytes", path, max)
	}
	return b, err
}

// caTrustEnv points the runtimes that keep their own roots at the
// bundle: Node's extra CAs, Python requests' and OpenSSL's bundle.
var caTrustEnv = map[string]string{
	"NODE_EXTRA_CA_CERTS": egressCAFile,
	"REQUESTS_CA_BUNDLE":  systemBundle,
	"SSL_CERT_FILE":       systemBundle,
	"CURL_CA_BUNDLE":      systemBundle,
}

// trustEgressCA installs the node's egress CA in the trust store of sb
// (through envd) if its connections may be intercepted: the system bundle
// (made from the image's own, wherever its distribution keeps it) and the
// CA's own file. The CA file is written last and read first: when it
// already holds this node's CA, the bundle was done with it, and a create,
// fork child or resume costs one small read.
func (m *Manager) trustEgressCA(ctx context.Context, envd *envdclient.Client, sb *store.Sandbox) error {
	if !m.intercepted(sb) || envd == nil {
		return nil
	}
	ca := m.cfg.Egress.CACert()
	installed, err := readSandboxFile(ctx, envd, egressCAFile, int64(len(ca)))
	if err == nil && bytes.Equal(installed, ca) {
		return nil
	}
	bundle, err := readSandboxFile(ctx, envd, systemBundle, maxBundleBytes)
	for _, other := range otherBundles {
		if err != nil || len(bundle) > 0 {
			break
		}
		bundle, err = readSandboxFile(ctx, envd, other, maxBundleBytes)
	}
	if err != nil {
		return fmt.Errorf("install the egress CA: %w", err)
	}
	if !bytes.Contains(bundle, bytes.TrimSpace(ca)) {
		if len(bundle) > 0 && !bytes.HasSuffix(bundle, []byte("\n")) {
			bundle = append(bundle, '\n')
		}
		if err := envd.WriteFile(ctx, systemBundle, bytes.NewReader(append(bundle, ca...)), "root"); err != nil {
			return fmt.Errorf("add the egress CA to the sandbox's CA bundle: %w", err)
		}
	}
	if err := envd.WriteFile(ctx, egressCAFile, bytes.NewReader(ca), "root"); err != nil {
		return fmt.Errorf("install the egress CA: %w", err)
	}
	return nil
}
