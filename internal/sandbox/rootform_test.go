package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// bootImage is a driver whose boots over any rootfs get the image digest.
type bootImage struct {
	runtime.Driver
	digest string
}

func (b bootImage) RootImageDigest(context.Context, string) (string, error) { return b.digest, nil }

func (b bootImage) CollectRootImages(context.Context) (int, error) { return 0, nil }

// A restore takes the root file system form its checkpoint was taken
// with, whatever the node boots with; a boot takes the node's.
func TestRootForm(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	overImage, overDir, malformed := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(overImage, runtime.RootImageRecord), []byte(digest+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(malformed, runtime.RootImageRecord), []byte("nonsense"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name          string
		imageDir      string
		nodeRootImage bool
		bootDigest    string // of the image boots get; "": another
		want          rootForm
		wantImage     bool
		wantDigest    string
	}{
		{"boot, directory node", "", false, "", rootFromNode, false, ""},
		{"boot, image node", "", true, "", rootFromNode, true, ""},
		// The same form as a boot's: restores share its prepared sandboxes.
		{"directory checkpoint, directory node", overDir, false, "", rootFromNode, false, ""},
		{"directory checkpoint, image node", overDir, true, "", rootDirectory, false, ""},
		{"image checkpoint, directory node", overImage, false, digest, rootForm(digest), true, digest},
		{"image checkpoint, image node, the boots' image", overImage, true, digest, rootFromNode, true, ""},
		{"image checkpoint, image node, another image", overImage, true, "sha256:" + strings.Repeat("cd", 32), rootForm(digest), true, digest},
		// The driver's restore reads the record again and says what is wrong.
		{"malformed record", malformed, true, "", rootDirectory, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &Manager{cfg: Config{RootImage: tt.nodeRootImage}, logger: slog.New(slog.DiscardHandler),
				driver: bootImage{digest: tt.bootDigest}}
			got := m.rootOf(t.Context(), tt.imageDir, "/rootfs")
			if got != tt.want {
				t.Fatalf("rootOf = %q, want %q", got, tt.want)
			}
			var spec runtime.Spec
			got.apply(&spec, tt.nodeRootImage)
			if spec.RootImage != tt.wantImage || spec.RootImageDigest != tt.wantDigest {
				t.Errorf("spec RootImage %v digest %q, want %v %q", spec.RootImage, spec.RootImageDigest, tt.wantImage, tt.wantDigest)
			}
		})
	}
}

// collectingDriver counts the driver's collections of root images.
type collectingDriver struct {
	*fakeDriver
	collects *atomic.Int32
}

func (d collectingDriver) RootImageDigest(context.Context, string) (string, error) {
	return "", errors.New("this driver makes no root images")
}

func (d collectingDriver) CollectRootImages(context.Context) (int, error) {
	d.collects.Add(1)
	return 1, nil
}

// TestRootImagesCollectedWhileRunning: a node collects the root images no
// template needs as it runs, not only at start, and no more often than
// asked.
func TestRootImagesCollectedWhileRunning(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
		want     bool
	}{
		{"every 20ms", 20 * time.Millisecond, true},
		{"every hour", time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var collects atomic.Int32
			w := newWorld(t, func(c *Config) {
				c.MonitorInterval = 5 * time.Millisecond
				c.RootImageCollectInterval = tc.interval
			})
			w.stop()
			w.wrap = func(d *fakeDriver) runtime.Driver { return collectingDriver{d, &collects} }
			w.start()
			if tc.want {
				waitFor(t, func() bool { return collects.Load() >= 2 })
				return
			}
			// Ten monitor rounds (each lists the sandboxes there are), and
			// no collection.
			w.create()
			base := w.faults.count("list")
			waitFor(t, func() bool { return w.faults.count("list") >= base+10 })
			if n := collects.Load(); n != 0 {
				t.Errorf("%d collections within an hour of the start", n)
			}
		})
	}
}
