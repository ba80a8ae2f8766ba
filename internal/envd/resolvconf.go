package envd

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

func (s *Server) resolvConfPath() string {
	if s.resolv != "" {
		return s.resolv
	}
	return "/etc/resolv.conf"
}

// writeResolvConf replaces path with one nameserver line per address;
// anything that is not an IP address is refused.
func writeResolvConf(path string, servers []string) error {
	var b strings.Builder
	b.WriteString("# written by aenv envd at /init\n")
	for _, srv := range servers {
		addr, err := netip.ParseAddr(srv)
		if err != nil {
			return fmt.Errorf("nameserver %q: %w", srv, err)
		}
		fmt.Fprintf(&b, "nameserver %s\n", addr)
	}
	tmp := filepath.Join(filepath.Dir(path), ".resolv.conf.aenv")
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	// resolv.conf may be a symlink (systemd); replace the link itself.
	return os.Rename(tmp, path)
}
