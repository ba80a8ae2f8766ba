package image

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func TestRegistryPolicyRefuses(t *testing.T) {
	sandboxes := []netip.Prefix{netip.MustParsePrefix("10.211.0.0/16")}
	tests := []struct {
		addr    string
		refused bool
	}{
		{"127.0.0.1", true},
		{"127.1.2.3", true},
		{"::1", true},
		{"::ffff:127.0.0.1", true}, // IPv4-mapped
		{"0.0.0.0", true},          // reaches this host
		{"::", true},
		{"169.254.169.254", true}, // cloud metadata
		{"fe80::1", true},
		{"224.0.0.1", true},
		{"10.211.3.4", true},        // the sandbox range
		{"::ffff:10.211.3.4", true}, // the sandbox range, IPv4-mapped
		{"10.1.2.3", false},         // a registry on the operator's network
		{"192.168.1.10", false},
		{"93.184.216.34", false},
		{"2001:db8::1", false},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			p := RegistryPolicy{Denied: sandboxes}
			err := p.check(netip.MustParseAddr(tt.addr))
			if tt.refused != (err != nil) {
				t.Errorf("check(%s) = %v, want refused=%v", tt.addr, err, tt.refused)
			}
			if err != nil && !errors.Is(err, ErrRefusedAddress) {
				t.Errorf("check(%s) = %v, want ErrRefusedAddress", tt.addr, err)
			}
			p.AllowPrivate = true
			if err := p.check(netip.MustParseAddr(tt.addr)); err != nil {
				t.Errorf("with AllowPrivate: check(%s) = %v", tt.addr, err)
			}
		})
	}
}

// This host's own addresses reach its own API like loopback does.
func TestRegistryPolicyRefusesOwnAddresses(t *testing.T) {
	var p RegistryPolicy
	for _, addr := range hostAddrs(t) {
		// Other tests add and remove veths meanwhile: an address gone by
		// the time of the check is no longer this host's.
		if err := p.check(addr); !errors.Is(err, ErrRefusedAddress) && slices.Contains(hostAddrs(t), addr) {
			t.Errorf("check(%s) = %v, want ErrRefusedAddress (an address of this host)", addr, err)
		}
	}
}

func hostAddrs(t *testing.T) []netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ipnet, ok := a.(*net.IPNet); ok {
			addr, _ := netip.AddrFromSlice(ipnet.IP)
			out = append(out, addr.Unmap())
		}
	}
	return out
}

// A pull names a registry on loopback, directly or by a name that resolves
// there: the server must not fetch it (it would fetch its own API).
func TestPullRefusesPrivateRegistries(t *testing.T) {
	reg := testRegistry(t)
	push(t, reg+"/repo:1", buildImage(t, "linux/amd64", v1.Config{}, layer(t, file("f", "x"))))
	_, port, _ := strings.Cut(reg, ":")
	for _, ref := range []string{reg + "/repo:1", "localhost:" + port + "/repo:1"} {
		t.Run(ref, func(t *testing.T) {
			_, err := Pull(context.Background(), ref, PullOptions{LayerDir: t.TempDir()})
			if !errors.Is(err, ErrRefusedAddress) {
				t.Fatalf("err = %v, want ErrRefusedAddress", err)
			}
			if !strings.Contains(err.Error(), "allow-private-registries") {
				t.Errorf("err = %v; want it to name the flag that allows it", err)
			}
			if _, err := Pull(context.Background(), ref, PullOptions{LayerDir: t.TempDir(),
				Registries: RegistryPolicy{AllowPrivate: true}}); err != nil {
				t.Errorf("with AllowPrivate: %v", err)
			}
		})
	}
}

// The check is made on each connection, so a registry that is allowed
// cannot redirect the pull to one that is not.
func TestPullRefusesRedirectToRefusedAddress(t *testing.T) {
	inner := newServerOn(t, "127.0.0.2:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the refused address was fetched: %s", r.URL)
	}))
	outer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://"+inner+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(outer.Close)
	innerAddr := netip.MustParseAddrPort(inner).Addr()
	policy := RegistryPolicy{AllowPrivate: true}
	policy.deny = func(a netip.Addr) bool { return a == innerAddr }
	ref := strings.TrimPrefix(outer.URL, "http://") + "/repo:1"
	_, err := Pull(context.Background(), ref, PullOptions{LayerDir: t.TempDir(), Registries: policy})
	if !errors.Is(err, ErrRefusedAddress) {
		t.Fatalf("err = %v, want ErrRefusedAddress", err)
	}
}

// Behind the operator's proxy, the proxy is reached even on loopback (it is
// theirs), and the registry's own address is what gets checked.
func TestPullThroughProxy(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	regHandler := registry.New(registry.Logger(nopLogger()))
	// A forward proxy that answers every request from one registry, as if
	// it had fetched it from the host asked for.
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Host)
		mu.Unlock()
		regHandler.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	proxyURL, err := url.Parse(proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	// Push straight to the proxy, as the registry behind it.
	push(t, strings.TrimPrefix(proxy.URL, "http://")+"/repo:1",
		buildImage(t, "linux/amd64", v1.Config{}, layer(t, file("f", "via proxy"))))
	mu.Lock()
	asked = nil
	mu.Unlock()

	policy := RegistryPolicy{Denied: []netip.Prefix{netip.MustParsePrefix("10.211.0.0/16")},
		proxy: func(*http.Request) (*url.URL, error) { return proxyURL, nil }}
	// RFC 1918 names are pulled over plain HTTP, which the proxy forwards.
	if _, err := Pull(context.Background(), "10.1.2.3:5000/repo:1", PullOptions{LayerDir: t.TempDir(), Registries: policy}); err != nil {
		t.Fatalf("pull through a proxy on loopback: %v", err)
	}
	mu.Lock()
	if !slices.Contains(asked, "10.1.2.3:5000") {
		t.Errorf("the proxy was asked for %v, want 10.1.2.3:5000", asked)
	}
	asked = nil
	mu.Unlock()
	_, err = Pull(context.Background(), "10.211.0.5:5000/repo:1", PullOptions{LayerDir: t.TempDir(), Registries: policy})
	if !errors.Is(err, ErrRefusedAddress) {
		t.Fatalf("pull of the sandbox range through a proxy: err = %v, want ErrRefusedAddress", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 0 {
		t.Errorf("the proxy was asked for %v, want nothing", asked)
	}
}

// Whatever answers at the registry's address, its reply body does not go
// back to the client in the error: the address may be some other service.
func TestPullErrorsDoNotEchoReplies(t *testing.T) {
	const secret = "internal-secret-4f2a"
	for _, status := range []int{http.StatusOK, http.StatusNotFound, http.StatusUnauthorized, http.StatusInternalServerError, http.StatusTeapot} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				w.Write([]byte(`{"errors":[{"code":"X","message":"` + secret + `"}],"secret":"` + secret + `"}`))
			}))
			t.Cleanup(srv.Close)
			ref := strings.TrimPrefix(srv.URL, "http://") + "/repo:1"
			_, err := Pull(context.Background(), ref, PullOptions{LayerDir: t.TempDir(), Registries: RegistryPolicy{AllowPrivate: true}})
			if err == nil {
				t.Fatal("pull succeeded")
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error repeats the reply: %v", err)
			}
		})
	}
}

func newServerOn(t *testing.T, addr string, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
	srv.Start()
	t.Cleanup(srv.Close)
	return ln.Addr().String()
}
