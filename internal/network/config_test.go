package network

import (
	"net/netip"
	"strings"
	"testing"
)

func TestSlotMath(t *testing.T) {
	cfg := Config{Prefix: "aenv", CIDR: netip.MustParsePrefix("10.99.0.0/16")}
	tests := []struct {
		index int
		want  Slot
	}{
		{0, Slot{Index: 0, Netns: "aenv-0", NetnsPath: "/var/run/netns/aenv-0", HostVeth: "aenv0h",
			HostIP: netip.MustParseAddr("10.99.0.1"), SandboxIP: netip.MustParseAddr("10.99.0.2")}},
		{1, Slot{Index: 1, Netns: "aenv-1", NetnsPath: "/var/run/netns/aenv-1", HostVeth: "aenv1h",
			HostIP: netip.MustParseAddr("10.99.0.5"), SandboxIP: netip.MustParseAddr("10.99.0.6")}},
		{64, Slot{Index: 64, Netns: "aenv-64", NetnsPath: "/var/run/netns/aenv-64", HostVeth: "aenv64h",
			HostIP: netip.MustParseAddr("10.99.1.1"), SandboxIP: netip.MustParseAddr("10.99.1.2")}},
		{16383, Slot{Index: 16383, Netns: "aenv-16383", NetnsPath: "/var/run/netns/aenv-16383", HostVeth: "aenv16383h",
			HostIP: netip.MustParseAddr("10.99.255.253"), SandboxIP: netip.MustParseAddr("10.99.255.254")}},
	}
	for _, tt := range tests {
		got := cfg.slot(tt.index)
		if *got != tt.want {
			t.Errorf("slot(%d) = %+v, want %+v", tt.index, *got, tt.want)
		}
		if i, ok := cfg.indexFromHostVeth(got.HostVeth); !ok || i != tt.index {
			t.Errorf("indexFromHostVeth(%q) = %d, %v; want %d", got.HostVeth, i, ok, tt.index)
		}
		if i, ok := cfg.indexFromNetns(got.Netns); !ok || i != tt.index {
			t.Errorf("indexFromNetns(%q) = %d, %v; want %d", got.Netns, i, ok, tt.index)
		}
	}
	if got, want := cfg.capacity(), 16384; got != want {
		t.Errorf("capacity = %d, want %d", got, want)
	}
}

func TestParseNamesRejectsOthers(t *testing.T) {
	cfg := Config{Prefix: "aenv", CIDR: netip.MustParsePrefix("10.99.0.0/16")}
	vethNames := []string{"aenv", "aenvh", "aenv-1h", "aenv01h", "aenv1", "aenvx1h", "xaenv1h", "aenv1h2", "eth0", "aenv+1h"}
	for _, name := range vethNames {
		if i, ok := cfg.indexFromHostVeth(name); ok {
			t.Errorf("indexFromHostVeth(%q) = %d, want no match", name, i)
		}
	}
	netnsNames := []string{"aenv", "aenv-", "aenv1", "aenv-01", "aenv--1", "aenvx-1", "aenv-1x", "other-1"}
	for _, name := range netnsNames {
		if i, ok := cfg.indexFromNetns(name); ok {
			t.Errorf("indexFromNetns(%q) = %d, want no match", name, i)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	cidr := netip.MustParsePrefix("10.99.0.0/16")
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // empty: valid
	}{
		{"default", Config{Prefix: "aenv", CIDR: cidr, WarmPool: 8}, ""},
		{"one letter", Config{Prefix: "a", CIDR: cidr}, ""},
		{"digits inside", Config{Prefix: "t9z", CIDR: cidr}, ""},
		{"single slot", Config{Prefix: "aenv", CIDR: netip.MustParsePrefix("10.99.0.4/30"), WarmPool: 1}, ""},
		{"longest prefix for /16", Config{Prefix: "abcdefghi", CIDR: cidr}, ""}, // abcdefghi16383h: 15
		{"empty prefix", Config{CIDR: cidr}, "network prefix"},
		{"upper case", Config{Prefix: "Aenv", CIDR: cidr}, "network prefix"},
		{"dash", Config{Prefix: "a-b", CIDR: cidr}, "network prefix"},
		{"ends in digit", Config{Prefix: "aenv1", CIDR: cidr}, "network prefix"},
		{"starts with digit", Config{Prefix: "1aenv", CIDR: cidr}, "network prefix"},
		{"veth name too long", Config{Prefix: "abcdefghij", CIDR: cidr}, "exceeds 15"},
		{"too long for /8", Config{Prefix: "aenvaenv", CIDR: netip.MustParsePrefix("10.0.0.0/8")}, "exceeds 15"},
		{"zero CIDR", Config{Prefix: "aenv"}, "want an IPv4 prefix"},
		{"IPv6", Config{Prefix: "aenv", CIDR: netip.MustParsePrefix("fd00::/64")}, "want an IPv4 prefix"},
		{"host bits", Config{Prefix: "aenv", CIDR: netip.MustParsePrefix("10.99.1.0/16")}, "host bits set"},
		{"smaller than a slot", Config{Prefix: "aenv", CIDR: netip.MustParsePrefix("10.99.0.0/31")}, "smaller than one /30"},
		{"negative warm pool", Config{Prefix: "aenv", CIDR: cidr, WarmPool: -1}, "warm pool"},
		{"warm pool above capacity", Config{Prefix: "aenv", CIDR: netip.MustParsePrefix("10.99.0.0/29"), WarmPool: 3}, "warm pool"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("validate() = %v, want nil", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("validate() = nil, want error containing %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("validate() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}
