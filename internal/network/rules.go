package network

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// HostRule is a header transform for the HTTPS requests a sandbox sends to
// the hosts Pattern names (E2B's network.rules): the egress gateway
// terminates such connections with the node's CA, sets Headers (whose
// values may name secrets, ${e2b.secrets.NAME}) and sends the requests on
// over TLS it verifies. A rule grants no access: AllowOut decides that.
type HostRule struct {
	// Pattern is a host name or a wildcard ("*.example.com": every name
	// under example.com, at any depth, not example.com itself), as
	// ParseHostPattern returns it.
	Pattern string
	Headers []Header // set in order, each replacing the request's own
}

// Header is one header a rule sets.
type Header struct {
	Name  string // canonical form
	Value string
}

// Bounds of a policy's rules.
const (
	maxRuleHosts       = 64
	maxRuleHeaders     = 32
	maxRuleHeaderBytes = 8 << 10
)

// headersNotSet are headers a transform may not set: they frame the
// request or the connection, which the gateway owns.
var headersNotSet = []string{"Host", "Content-Length", "Transfer-Encoding", "Connection", "Upgrade", "Te",
	"Trailer", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate", "Expect"}

// ParseRules checks E2B's network.rules (host to the header sets of its
// transforms, applied in order) and returns them as HostRules, sorted by
// pattern.
func ParseRules(rules map[string][]map[string]string) ([]HostRule, error) {
	if len(rules) > maxRuleHosts {
		return nil, fmt.Errorf("network rules name %d hosts: at most %d", len(rules), maxRuleHosts)
	}
	var out []HostRule
	seen := map[string]bool{}
	for host, transforms := range rules {
		if strings.TrimSpace(host) == "*" {
			return nil, fmt.Errorf("network rules: a bare * is not a host; name the hosts, as in *.example.com")
		}
		pattern, err := ParseHostPattern(host)
		if err != nil {
			return nil, fmt.Errorf("network rules: host %q: %v", host, err)
		}
		if seen[pattern] {
			return nil, fmt.Errorf("network rules: host %q is named twice", host)
		}
		seen[pattern] = true
		r := HostRule{Pattern: pattern}
		for _, headers := range transforms {
			names := make([]string, 0, len(headers))
			for name := range headers {
				names = append(names, name)
			}
			slices.Sort(names)
			for _, name := range names {
				h, err := checkHeader(name, headers[name])
				if err != nil {
					return nil, fmt.Errorf("network rules: host %q: %v", host, err)
				}
				r.Headers = append(r.Headers, h)
			}
		}
		if len(r.Headers) > maxRuleHeaders {
			return nil, fmt.Errorf("network rules: host %q sets %d headers: at most %d", host, len(r.Headers), maxRuleHeaders)
		}
		if len(r.Headers) == 0 {
			continue // nothing to set: the host is not intercepted
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b HostRule) int { return strings.Compare(a.Pattern, b.Pattern) })
	return out, nil
}

func checkHeader(name, value string) (Header, error) {
	if !httpguts.ValidHeaderFieldName(name) {
		return Header{}, fmt.Errorf("header %q: not a header name", name)
	}
	canonical := http.CanonicalHeaderKey(name)
	if slices.Contains(headersNotSet, canonical) {
		return Header{}, fmt.Errorf("header %s frames the request or the connection; a transform cannot set it", canonical)
	}
	if len(value) > maxRuleHeaderBytes {
		return Header{}, fmt.Errorf("header %s: a value of %d bytes, at most %d", canonical, len(value), maxRuleHeaderBytes)
	}
	if !httpguts.ValidHeaderFieldValue(value) {
		return Header{}, fmt.Errorf("header %s: its value holds a line break or another control character", canonical)
	}
	return Header{Name: canonical, Value: value}, nil
}

// MatchRule returns the rule for host: the one naming it exactly, else the
// longest wildcard over it (rules are not merged); nil for none.
func MatchRule(rules []HostRule, host string) *HostRule {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "" || !plainHostName(host) {
		return nil
	}
	var best *HostRule
	for i := range rules {
		r := &rules[i]
		suffix, wildcard := strings.CutPrefix(r.Pattern, "*")
		switch {
		case !wildcard && host == r.Pattern:
			return r
		case wildcard && len(host) > len(suffix) && strings.HasSuffix(host, suffix) &&
			(best == nil || len(r.Pattern) > len(best.Pattern)):
			best = r
		}
	}
	return best
}

func rulesEqual(a, b []HostRule) bool {
	return slices.EqualFunc(a, b, func(x, y HostRule) bool {
		return x.Pattern == y.Pattern && slices.Equal(x.Headers, y.Headers)
	})
}
