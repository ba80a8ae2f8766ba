"""Network: a sandbox's egress policy, in the shape the create call takes."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class Network:
    """Egress policy for create_sandbox(network=...).

    allow_internet: whether traffic not matched by a list may leave.
    denied_cidrs are always refused, allowed_cidrs always let through
    (allowed wins over denied, as in the seed's NetworkIsolationConfig).
    allowed_domains are host names ("pypi.org") and wildcards
    ("*.github.com") let through whatever the CIDRs deny, judged by the
    node on TLS SNI and HTTP Host (docs/egress.md). egress_proxy is a
    SOCKS5 proxy the allowed TCP egress goes through: {"address":
    "host:port", "username": ..., "password": ...}. header_rules set headers
    on the HTTPS requests to a host, values naming the team's secrets as
    ${e2b.secrets.NAME} (create_secret): {"api.openai.com": {"Authorization":
    "Bearer ${e2b.secrets.openai-key}"}}; the node's egress gateway fills them
    in, so the sandbox never holds the secret (docs/egress.md).
    """

    allow_internet: bool = True
    denied_cidrs: List[str] = field(default_factory=list)
    allowed_cidrs: List[str] = field(default_factory=list)
    allowed_domains: List[str] = field(default_factory=list)
    egress_proxy: Optional[Dict[str, str]] = None
    header_rules: Dict[str, Dict[str, str]] = field(default_factory=dict)

    def _rules(self) -> Dict[str, Any]:
        return {host: [{"transform": {"headers": dict(headers)}}] for host, headers in self.header_rules.items()}

    def to_api_request(self) -> Dict[str, Any]:
        # Validate here so a typo fails before a sandbox is asked for.
        out: Dict[str, Any] = {
            "allowInternetAccess": bool(self.allow_internet),
            "alwaysDeniedCIDRs": [str(ipaddress.ip_network(c, strict=False)) for c in self.denied_cidrs],
            "alwaysAllowedCIDRs": [str(ipaddress.ip_network(c, strict=False)) for c in self.allowed_cidrs],
        }
        if self.allowed_domains:
            # The server checks the names and says what is wrong with one.
            out["alwaysAllowedDomains"] = [str(d) for d in self.allowed_domains]
        network: Dict[str, Any] = {}
        if self.egress_proxy is not None:
            network["egressProxy"] = dict(self.egress_proxy)
        if self.header_rules:
            network["rules"] = self._rules()
        if network:
            out["network"] = network
        return out

    def to_update_request(self) -> Dict[str, Any]:
        """The body of PUT /sandboxes/{id}/network (E2B's updateNetwork),
        which replaces the whole policy."""
        out: Dict[str, Any] = {
            "allowInternetAccess": bool(self.allow_internet),
            "allowOut": [str(ipaddress.ip_network(c, strict=False)) for c in self.allowed_cidrs]
            + [str(d) for d in self.allowed_domains],
            "denyOut": [str(ipaddress.ip_network(c, strict=False)) for c in self.denied_cidrs],
        }
        if self.egress_proxy is not None:
            out["egressProxy"] = dict(self.egress_proxy)
        if self.header_rules:
            out["rules"] = self._rules()
        return out
