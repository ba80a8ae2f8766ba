package bench

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestCleanupsRunNewestFirstAndSkipDone(t *testing.T) {
	var c cleanups
	var ran []string
	undo := func(name string, err error) func(context.Context) error {
		return func(context.Context) error { ran = append(ran, name); return err }
	}
	c.push("a", undo("a", nil))
	b := c.push("b", undo("b", nil))
	c.push("c", undo("c", errors.New("stuck")))
	c.push("d", undo("d", nil))
	c.done(b)
	c.done(b) // twice is harmless
	if c.pending() != 3 {
		t.Fatalf("pending %d, want 3", c.pending())
	}
	failed := c.run(context.Background())
	if want := []string{"d", "c", "a"}; !slices.Equal(ran, want) {
		t.Errorf("ran %v, want %v (newest first, a failure does not stop the rest)", ran, want)
	}
	if len(failed) != 1 || !strings.Contains(failed[0], "clean up c: stuck") {
		t.Errorf("failed = %q", failed)
	}
	if c.pending() != 0 || len(c.run(context.Background())) != 0 {
		t.Error("a second run did something")
	}
}
