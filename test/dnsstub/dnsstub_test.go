package dnsstub

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, "127.0.0.1:0", map[string]netip.Addr{
		"Lab.Example.test.": netip.MustParseAddr("127.9.8.7"),
		"other.test":        netip.MustParseAddr("127.1.2.3"),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	for _, network := range []string{"udp", "tcp"} {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, s.Addr())
		}}
		for _, tc := range []struct {
			name string
			want []string // nil: no such host
		}{
			{"lab.example.test", []string{"127.9.8.7"}},
			{"api.lab.example.test", []string{"127.9.8.7"}},
			{"49983-abcdefghij0123456789.LAB.example.test", []string{"127.9.8.7"}},
			{"other.test", []string{"127.1.2.3"}},
			{"example.test", nil},
			{"notlab.example.test", nil},
			{"lab.example.test.elsewhere", nil},
		} {
			got, err := r.LookupHost(ctx, tc.name)
			if tc.want == nil {
				var dnsErr *net.DNSError
				if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
					t.Errorf("%s %s: got %v, %v; want not found", network, tc.name, got, err)
				}
				continue
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("%s %s: got %v, %v; want %v", network, tc.name, got, err, tc.want)
			}
		}
		// A zone's name has no IPv6 address: an empty answer, not an error
		// that would fail a client asking for both.
		ips, err := r.LookupIP(ctx, "ip6", "api.lab.example.test")
		var dnsErr *net.DNSError
		if len(ips) != 0 || !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
			t.Errorf("%s AAAA: got %v, %v; want no address", network, ips, err)
		}
	}
}

func TestRejectsIPv6(t *testing.T) {
	_, err := Start(context.Background(), "127.0.0.1:0", map[string]netip.Addr{"x.test": netip.MustParseAddr("::1")})
	if err == nil {
		t.Fatal("Start accepted an IPv6 address")
	}
}

func TestCloseEndsConnections(t *testing.T) {
	s, err := Start(context.Background(), "127.0.0.1:0", map[string]netip.Addr{"x.test": netip.MustParseAddr("127.0.0.2")})
	if err != nil {
		t.Fatal(err)
	}
	// An idle TCP connection must not keep Close waiting.
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits on an idle connection")
	}
}
