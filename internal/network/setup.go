package network

import (
	"context"
	"fmt"
)

// setUpHost gathers what the firewall needs to know about the host, installs it
// keeping the policies of the slots in keep, and enables forwarding on the uplinks.
func (p *Pool) setUpHost(ctx context.Context, keep map[int]bool) error {
	dns := p.cfg.DNSServers
	if dns == nil {
		var err error
		if dns, err = HostDNSServers(); err != nil {
			// Sandboxes still work, by address; name resolution fails inside them.
			p.logger.WarnContext(ctx, "no DNS servers for sandboxes", "err", err)
		}
	}
	addrs, err := hostAddrs()
	if err != nil {
		return err
	}
	uplinks := p.cfg.Uplinks
	if uplinks == nil {
		if uplinks, err = defaultRouteLinks(); err != nil {
			return err
		}
		if len(uplinks) == 0 {
			p.logger.WarnContext(ctx, "no IPv4 default route: sandboxes cannot reach the outside")
		}
	}

	p.policyMu.Lock()
	defer p.policyMu.Unlock()
	p.mu.Lock()
	p.dns = dns
	p.mu.Unlock()
	if p.cfg.Egress != nil {
		p.cfg.Egress.SetDenied(fixedDenyPrefixes(p.cfg, addrs))
	}
	if err := installFirewall(p.cfg, fixedDenyRanges(p.cfg, addrs), keep); err != nil {
		return err
	}
	for _, name := range uplinks {
		if err := enableForwarding(name); err != nil {
			return fmt.Errorf("uplink: %w", err)
		}
	}
	p.logger.InfoContext(ctx, "network firewall installed", "dns", dns, "uplinks", uplinks)
	return nil
}
