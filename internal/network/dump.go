package network

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// dumpRetries bounds the retries of a netlink dump that the kernel marked
// interrupted (NLM_F_DUMP_INTR): the table changed while it was read, as it
// does when other sandboxes start or stop at the same moment.
const dumpRetries = 5

// retryDump runs a netlink dump until it is not interrupted, or returns the
// last result (partial, with netlink.ErrDumpInterrupted) after dumpRetries.
func retryDump[T any](dump func() (T, error)) (T, error) {
	var v T
	var err error
	for range dumpRetries {
		v, err = dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}
