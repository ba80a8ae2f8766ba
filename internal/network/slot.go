package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// sandboxIface is the name of the slot's veth end inside its namespace; runsc with
// --network=sandbox takes it over.
const sandboxIface = "eth0"

// Slot is one sandbox's network: a named netns holding eth0 with SandboxIP, and the
// host end of the veth pair with HostIP, both in one /30.
type Slot struct {
	Index     int
	Netns     string     // netns name
	NetnsPath string     // /var/run/netns/<Netns>, for the runtime spec
	HostVeth  string     // host end of the veth pair, in the root netns
	HostIP    netip.Addr // .1 of the slot's /30, on HostVeth
	SandboxIP netip.Addr // .2 of the slot's /30, on eth0 inside the netns
}

// createSlot builds s's netns and veth pair and configures them. On failure it removes
// whatever it built.
func createSlot(s *Slot) (err error) {
	// The index is free, so anything carrying its names is a leftover of ours
	// (a failed destroy, a crash after Start): clear it rather than fail on it.
	if err := destroySlot(s); err != nil {
		return fmt.Errorf("create slot %d: clear leftovers: %w", s.Index, err)
	}
	if err := createNamedNetns(s.NetnsPath); err != nil {
		return fmt.Errorf("create slot %d: %w", s.Index, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, destroySlot(s))
		}
	}()
	ns, err := netns.GetFromPath(s.NetnsPath)
	if err != nil {
		return fmt.Errorf("create slot %d: open netns: %w", s.Index, err)
	}
	defer ns.Close()

	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: s.HostVeth},
		PeerName:  sandboxIface,
		// Created directly inside the slot's netns, so it never clashes with the
		// host's own eth0.
		PeerNamespace: netlink.NsFd(ns),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create slot %d: add veth %s: %w", s.Index, s.HostVeth, err)
	}
	if err := configureSlot(s, ns); err != nil {
		return fmt.Errorf("create slot %d: %w", s.Index, err)
	}
	if err := waitVethUp(s, ns); err != nil {
		return fmt.Errorf("create slot %d: %w", s.Index, err)
	}
	return nil
}

// operUpTimeout bounds the wait for a new veth to come up.
const operUpTimeout = 3 * time.Second

// waitVethUp waits until both ends of a new veth are operationally up. Until
// the kernel's link watcher has run (up to about a second), a new veth drops
// what it is given: the server's first connection to envd would wait for a
// TCP retransmit.
func waitVethUp(s *Slot, ns netns.NsHandle) error {
	inside, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in netns: %w", err)
	}
	defer inside.Close()
	deadline := time.Now().Add(operUpTimeout)
	for {
		host, err := netlink.LinkByName(s.HostVeth)
		if err != nil {
			return fmt.Errorf("find %s: %w", s.HostVeth, err)
		}
		eth, err := inside.LinkByName(sandboxIface)
		if err != nil {
			return fmt.Errorf("find %s in netns: %w", sandboxIface, err)
		}
		if host.Attrs().OperState == netlink.OperUp && eth.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("veth %s not up after %s", s.HostVeth, operUpTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// configureSlot puts the addresses on both veth ends, brings them and the netns's
// loopback up, lets the host forward what the slot sends and gives the netns a default
// route through the host end. It is idempotent: releasing a slot runs it again,
// because runsc takes the address (and with it the route) off eth0 when it adopts the
// interface. runsc copies the netns's routes when the sandbox starts, so the route
// must be there before.
func configureSlot(s *Slot, ns netns.NsHandle) error {
	host, err := netlink.LinkByName(s.HostVeth)
	if err != nil {
		return fmt.Errorf("find %s: %w", s.HostVeth, err)
	}
	if err := netlink.AddrReplace(host, slotAddr(s.HostIP)); err != nil {
		return fmt.Errorf("address %s: %w", s.HostVeth, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("bring up %s: %w", s.HostVeth, err)
	}
	if err := enableForwarding(s.HostVeth); err != nil {
		return err
	}
	if err := enableStrictSource(s.HostVeth); err != nil {
		return err
	}

	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in netns %s: %w", s.Netns, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in %s: %w", s.Netns, err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bring up lo in %s: %w", s.Netns, err)
	}
	eth, err := h.LinkByName(sandboxIface)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", sandboxIface, s.Netns, err)
	}
	if err := h.AddrReplace(eth, slotAddr(s.SandboxIP)); err != nil {
		return fmt.Errorf("address %s in %s: %w", sandboxIface, s.Netns, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("bring up %s in %s: %w", sandboxIface, s.Netns, err)
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(s.HostIP.AsSlice())}
	if err := h.RouteReplace(route); err != nil {
		return fmt.Errorf("default route in %s: %w", s.Netns, err)
	}
	return nil
}

// resetSlot restores a released slot's addresses and links.
func resetSlot(s *Slot) error {
	ns, err := netns.GetFromPath(s.NetnsPath)
	if err != nil {
		return fmt.Errorf("reset slot %d: open netns: %w", s.Index, err)
	}
	defer ns.Close()
	if err := configureSlot(s, ns); err != nil {
		return fmt.Errorf("reset slot %d: %w", s.Index, err)
	}
	return nil
}

// forgetSandbox drops the host's neighbour entry and conntrack flows for s.SandboxIP,
// so the next sandbox on this address starts clean.
func forgetSandbox(s *Slot) error {
	var errs []error
	host, err := netlink.LinkByName(s.HostVeth)
	if err != nil {
		return fmt.Errorf("find %s: %w", s.HostVeth, err)
	}
	neigh := &netlink.Neigh{LinkIndex: host.Attrs().Index, Family: netlink.FAMILY_V4, IP: net.IP(s.SandboxIP.AsSlice())}
	if err := netlink.NeighDel(neigh); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("delete neighbour %s: %w", s.SandboxIP, err))
	}
	if err := deleteFlowsOf(s.SandboxIP); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkSlotExists reports a missing host veth or netns pin of s.
func checkSlotExists(s *Slot) error {
	if _, err := netlink.LinkByName(s.HostVeth); err != nil {
		return fmt.Errorf("find %s: %w", s.HostVeth, err)
	}
	if _, err := os.Stat(s.NetnsPath); err != nil {
		return fmt.Errorf("find netns: %w", err)
	}
	return nil
}

// destroySlot removes s's veth pair and netns pin. Missing parts are not an error.
func destroySlot(s *Slot) error {
	var errs []error
	if err := deleteLinkByName(s.HostVeth); err != nil {
		errs = append(errs, err)
	}
	if err := deleteNamedNetns(s.NetnsPath); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroy slot %d: %w", s.Index, err)
	}
	return nil
}

// deleteLinkByName deletes a link of the root netns, and with a veth its peer.
func deleteLinkByName(name string) error {
	link, err := netlink.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := netlink.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

func slotAddr(ip netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(ip.AsSlice()), Mask: net.CIDRMask(slotPrefixBits, 32)}}
}
