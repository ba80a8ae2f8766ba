package bench

import (
	"context"
	"fmt"
	"sync"
)

// cleanups is a stack of undo actions for everything the bench made. An
// action whose thing was already removed in the normal course is dropped
// with done; whatever is left runs, newest first, when the bench ends:
// normally, on failure or on Ctrl-C.
type cleanups struct {
	mu    sync.Mutex
	next  int
	stack []cleanupEntry
}

type cleanupEntry struct {
	id   int
	what string
	undo func(context.Context) error
}

// push registers undo and returns a handle for done.
func (c *cleanups) push(what string, undo func(context.Context) error) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	c.stack = append(c.stack, cleanupEntry{id: c.next, what: what, undo: undo})
	return c.next
}

// done drops the action with handle id: its thing is gone.
func (c *cleanups) done(id int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.stack {
		if e.id == id {
			c.stack = append(c.stack[:i], c.stack[i+1:]...)
			return
		}
	}
}

// pending is how many actions are left.
func (c *cleanups) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.stack)
}

// run performs every remaining action, newest first, and returns what
// failed. It keeps going after a failure: one stuck sandbox must not leave
// the rest behind.
func (c *cleanups) run(ctx context.Context) []string {
	var failed []string
	for {
		c.mu.Lock()
		if len(c.stack) == 0 {
			c.mu.Unlock()
			return failed
		}
		e := c.stack[len(c.stack)-1]
		c.stack = c.stack[:len(c.stack)-1]
		c.mu.Unlock()
		if err := e.undo(ctx); err != nil {
			failed = append(failed, fmt.Sprintf("clean up %s: %v", e.what, err))
		}
	}
}
