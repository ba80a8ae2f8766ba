package runtimetest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
)

// Netns is a network namespace with a veth pair: eth0 inside, with
// GuestAddr, and a host end with HostAddr, on a /30.
type Netns struct {
	Name      string
	Path      string
	HostAddr  netip.Addr
	GuestAddr netip.Addr
}

// NewNetns makes a namespace and veth with random names and a random free
// 10.250.x.y/30, removed when the test ends.
func NewNetns(t testing.TB) *Netns {
	t.Helper()
	suffix := randomHex(t, 4)
	n := &Netns{Name: "aenvt-" + suffix, Path: "/var/run/netns/aenvt-" + suffix}
	hostVeth, guestVeth := "avh"+suffix, "avg"+suffix
	n.HostAddr, n.GuestAddr = freeSubnet(t)
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", hostVeth).Run()
		_ = exec.Command("ip", "netns", "del", n.Name).Run()
	})
	steps := [][]string{
		{"netns", "add", n.Name},
		{"link", "add", hostVeth, "type", "veth", "peer", "name", guestVeth},
		{"link", "set", guestVeth, "netns", n.Name},
		{"-n", n.Name, "link", "set", guestVeth, "name", "eth0"},
		{"-n", n.Name, "addr", "add", n.GuestAddr.String() + "/30", "dev", "eth0"},
		{"-n", n.Name, "link", "set", "eth0", "up"},
		{"-n", n.Name, "link", "set", "lo", "up"},
		{"-n", n.Name, "route", "add", "default", "via", n.HostAddr.String()},
		{"addr", "add", n.HostAddr.String() + "/30", "dev", hostVeth},
		{"link", "set", hostVeth, "up"},
	}
	for _, args := range steps {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return n
}

// freeSubnet picks a random 10.250.x.y/30 not on any host interface and
// returns its host and guest addresses.
func freeSubnet(t testing.TB) (host, guest netip.Addr) {
	t.Helper()
	out, err := exec.Command("ip", "-o", "-4", "addr").Output()
	if err != nil {
		t.Fatalf("ip addr: %v", err)
	}
	for range 100 {
		b := make([]byte, 2)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		base := netip.AddrFrom4([4]byte{10, 250, b[0], b[1] &^ 3})
		host, guest = base.Next(), base.Next().Next()
		if !strings.Contains(string(out), " "+host.String()+"/") && !strings.Contains(string(out), " "+guest.String()+"/") {
			return host, guest
		}
	}
	t.Fatal("no free 10.250.0.0/16 subnet")
	return
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// randomID returns a sandbox ID: 20 characters of [a-z0-9].
func randomID(t testing.TB) string {
	t.Helper()
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// String is for test logs.
func (n *Netns) String() string { return fmt.Sprintf("%s (%s)", n.Name, n.GuestAddr) }
