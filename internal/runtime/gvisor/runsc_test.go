package gvisor

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestRunscFileOwner(t *testing.T) {
	tests := []struct {
		name  string
		owner string
		ok    bool
	}{
		{"abc_sandbox:abc.state", "abc", true},
		{"abc_sandbox:abc.lock", "abc", true},
		{"sub_sandbox:abc.lock", "abc", true},
		{"runsc-abc.sock", "abc", true},
		{"null-netns", "", false},
		{"abc.lock", "", false},
		{"abc_sandbox:abc.json", "", false},
	}
	for _, tt := range tests {
		owner, ok := runscFileOwner(tt.name)
		if owner != tt.owner || ok != tt.ok {
			t.Errorf("runscFileOwner(%q) = %q, %v; want %q, %v", tt.name, owner, ok, tt.owner, tt.ok)
		}
	}
}

func TestBoundImage(t *testing.T) {
	if got := boundImage(0).timeout; got != imageBaseTimeout {
		t.Errorf("boundImage(0) = %v; want %v", got, imageBaseTimeout)
	}
	if got, want := boundImage(4<<30).timeout, imageBaseTimeout+4*imageTimeoutPerGiB; got != want {
		t.Errorf("boundImage(4 GiB) = %v; want %v", got, want)
	}
}

// TestRunBounded runs a fake runsc that hangs, with a helper process of
// its own, and checks that the bound ends both and says why: on timeout,
// on the caller's cancellation after the grace, and at once for a command
// without grace.
func TestRunBounded(t *testing.T) {
	tests := []struct {
		name     string
		b        bound
		cancel   bool
		wantErr  string
		atLeast  time.Duration
		canceled bool
	}{
		{"timeout", bound{timeout: time.Second, grace: time.Hour}, false, "no answer within 1s", time.Second, false},
		{"canceled after grace", bound{timeout: time.Hour, grace: time.Second}, true, "after the caller gave up", time.Second, true},
		{"canceled without grace", bound{timeout: time.Hour}, true, "after the caller gave up", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			helperPid := filepath.Join(dir, "helper.pid")
			script := filepath.Join(dir, "runsc")
			body := "#!/bin/sh\nsleep 3600 &\necho $! > " + helperPid + ".tmp\nmv " + helperPid + ".tmp " + helperPid + "\nwait\n"
			if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
				t.Fatal(err)
			}
			d := &Driver{cfg: Config{RunscPath: script, StateDir: dir}, log: slog.New(slog.DiscardHandler), platform: PlatformSystrap}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel {
				go func() {
					waitForFile(helperPid)
					cancel()
				}()
			}
			start := time.Now()
			_, err := d.runsc(ctx, tt.b, "", "pause", "x")
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("runsc = %v; want an error saying %q", err, tt.wantErr)
			}
			if errors.Is(err, context.Canceled) != tt.canceled {
				t.Errorf("runsc = %v; errors.Is(context.Canceled) want %v", err, tt.canceled)
			}
			if took < tt.atLeast || took > tt.atLeast+10*time.Second {
				t.Errorf("runsc returned after %v; want about %v", took, tt.atLeast)
			}
			b, err := os.ReadFile(helperPid)
			if err != nil {
				t.Fatalf("the fake runsc did not start its helper: %v", err)
			}
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			deadline := time.Now().Add(10 * time.Second)
			for processAlive(pid) {
				if time.Now().After(deadline) {
					t.Fatalf("helper %d of the killed runsc still runs", pid)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// waitForFile returns once path exists (or after 10 s).
func waitForFile(path string) {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
	}
}

func TestNamesSandbox(t *testing.T) {
	const id, other = "aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb"
	d := &Driver{cfg: Config{StateDir: "/s"}}
	tests := []struct {
		name    string
		cmdline []string
		want    bool
	}{
		{"sandbox process", []string{"runsc-sandbox", "--root=/s/runsc", "--log=/s/sandboxes/" + id + "/runsc.log", "boot", "--bundle=/s/sandboxes/" + id, id}, true},
		{"runsc command", []string{"/bin/runsc", "--root=/s/runsc", "delete", "--force", id}, true},
		{"holder of its lock", []string{"flock", "/s/runsc/" + id + "_sandbox:" + id + ".lock", "sleep", "1"}, true},
		{"another sandbox restoring an image named after it", []string{"/bin/runsc", "--root=/s/runsc", "--log=/s/sandboxes/" + other + "/runsc.log", "restore", "--image-path", "/d/images/fork-" + id, other}, false},
		{"another sandbox", []string{"/bin/runsc", "--root=/s/runsc", "pause", other}, false},
		{"the ID under another root", []string{"/bin/runsc", "--root=/t/runsc", "pause", id}, false},
		{"the ID alone", []string{"echo", id}, false},
	}
	for _, tt := range tests {
		cmdline := []byte(strings.Join(tt.cmdline, "\x00") + "\x00")
		if got := d.namesSandbox(cmdline, id); got != tt.want {
			t.Errorf("%s: namesSandbox(%q) = %v; want %v", tt.name, tt.cmdline, got, tt.want)
		}
	}
}
