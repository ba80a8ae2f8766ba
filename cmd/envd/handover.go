package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/envd"
)

// The init hands its serve child two descriptors: a socket to itself that
// carries the /init settings, and the listening socket.
//
// The settings must survive the serve process: tenant code can be root in
// the sandbox and kill it, and a serve process that came back empty would
// take every call without a token and let anyone /init it. So the init
// keeps the latest settings in its own memory, nowhere in the sandbox's
// filesystem, which tenant root could read or replace; the child sends them
// on every /init before answering, and a new child receives them before it
// serves. Checkpoints keep the init's memory and the socket's buffered
// bytes, so a restored or forked sandbox comes back with them too.
//
// The listener stays open in the init while no child runs, so nothing else
// in the sandbox can bind envd's port and collect the token the server
// sends with every call; requests wait in its backlog for the next child.
const (
	childStateFD  = 3
	childListenFD = 4
)

// stateReceiveTimeout bounds the child's wait for the init's settings.
const stateReceiveTimeout = 30 * time.Second

// stateSendTimeout bounds one hand-over to the init.
const stateSendTimeout = 10 * time.Second

// stateConn is the serve child's end of the settings socket.
type stateConn struct {
	mu sync.Mutex // one hand-over at a time
	f  *os.File
}

// openStateConn takes over the inherited settings socket at fd and reads
// the settings the init kept, which it always sends first.
func openStateConn(fd int, timeout time.Duration) (*stateConn, envd.State, error) {
	// Nothing envd starts may inherit it.
	syscall.CloseOnExec(fd)
	// Non-blocking, so the runtime poller serves it and deadlines work.
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, envd.State{}, fmt.Errorf("settings socket fd %d: %w", fd, err)
	}
	f := os.NewFile(uintptr(fd), "envd-state")
	if err := f.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		f.Close()
		return nil, envd.State{}, fmt.Errorf("settings socket fd %d: %w", fd, err)
	}
	// The init sends exactly one message this way, so the decoder cannot
	// read ahead into anything else.
	var state envd.State
	if err := json.NewDecoder(f).Decode(&state); err != nil {
		f.Close()
		return nil, envd.State{}, fmt.Errorf("receive settings from init: %w", err)
	}
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, envd.State{}, fmt.Errorf("settings socket fd %d: %w", fd, err)
	}
	return &stateConn{f: f}, state, nil
}

// send hands state to the init. Once it returns nil the bytes are in the
// socket: the init reads them even if this process dies right after.
func (c *stateConn) send(state envd.State) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.f.SetWriteDeadline(time.Now().Add(stateSendTimeout)); err != nil {
		return fmt.Errorf("hand settings to init: %w", err)
	}
	if err := json.NewEncoder(c.f).Encode(state); err != nil {
		return fmt.Errorf("hand settings to init: %w", err)
	}
	return nil
}

func (c *stateConn) Close() error { return c.f.Close() }
