package network

import (
	"errors"
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
)

// removeSlotsExcept deletes every host veth and netns pin named like one of cfg's
// slots whose index is not in keep, and returns what it removed.
func removeSlotsExcept(cfg Config, keep map[int]bool) (removed []string, err error) {
	links, err := listLinks()
	if err != nil {
		return nil, fmt.Errorf("remove slots: %w", err)
	}
	var errs []error
	for _, l := range links {
		name := l.Attrs().Name
		i, ok := cfg.indexFromHostVeth(name)
		if !ok || keep[i] {
			continue
		}
		if err := netlink.LinkDel(l); err != nil && !errors.As(err, &netlink.LinkNotFoundError{}) {
			errs = append(errs, fmt.Errorf("delete veth %s: %w", name, err))
			continue
		}
		removed = append(removed, "veth "+name)
	}

	entries, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("list %s: %w", netnsDir, err))
	}
	for _, e := range entries {
		i, ok := cfg.indexFromNetns(e.Name())
		if !ok || keep[i] {
			continue
		}
		if err := deleteNamedNetns(netnsDir + "/" + e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "netns "+e.Name())
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("remove slots: %w", err)
	}
	return removed, nil
}

// listLinks lists the root netns's links, retrying a dump interrupted by concurrent
// changes (other slots being created), whose result may be incomplete.
func listLinks() ([]netlink.Link, error) {
	links, err := retryDump(netlink.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	return links, nil
}
