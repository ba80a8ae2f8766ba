package gvisor

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Platforms accepted in Config.Platform.
const (
	PlatformSystrap = "systrap"
	PlatformKVM     = "kvm"
	// PlatformAuto picks kvm when /dev/kvm exists and a probe sandbox starts
	// on it quickly (kvm hangs on some hosts), systrap otherwise.
	PlatformAuto = "auto"
)

// Config configures the gVisor driver.
type Config struct {
	// RunscPath is the runsc binary.
	RunscPath string
	// StateDir holds everything the driver writes: the runsc root, one
	// bundle directory per sandbox, logs.
	StateDir string
	// CgroupParent is the cgroup under which each sandbox gets a child named
	// by its ID, e.g. "/aenv-1234abcd". It must be unique per server: Cleanup
	// removes every child it does not keep. Empty derives one from StateDir.
	CgroupParent string
	// Platform is systrap (default), kvm or auto.
	Platform string
	// Debug turns on runsc debug logs in each sandbox's directory.
	Debug bool
	// CheckpointGofer is a binary that runs ckptgofer.Main when started as
	// ckptgofer.ProcessName (aenv itself). Restores of images holding a
	// ckptgofer.OptionsFile read them through it; empty leaves runsc's own.
	CheckpointGofer string
	// RootImageDir holds the root file system images of sandboxes with
	// runtime.Spec.RootImage (see rootimage.go). Restores need the image
	// at the path the checkpoint named, so nodes that restore each other's
	// checkpoints must use the same directory. Empty: such sandboxes are
	// refused.
	RootImageDir string
}

// withDefaults returns cfg with empty fields filled in.
func (cfg Config) withDefaults() Config {
	if cfg.Platform == "" {
		cfg.Platform = PlatformSystrap
	}
	if cfg.CgroupParent == "" && cfg.StateDir != "" {
		cfg.CgroupParent = defaultCgroupParent(cfg.StateDir)
	}
	return cfg
}

// defaultCgroupParent names the cgroup parent after the state directory, so
// that two servers with different state directories never share one.
func defaultCgroupParent(stateDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return "/aenv-" + hex.EncodeToString(sum[:])[:12]
}

// validate reports the first problem with a defaulted Config.
func (cfg Config) validate() error {
	switch {
	case cfg.RunscPath == "":
		return errors.New("runsc path is empty")
	case !filepath.IsAbs(cfg.StateDir):
		return fmt.Errorf("state dir %q is not an absolute path", cfg.StateDir)
	case cfg.RootImageDir != "" && (!filepath.IsAbs(cfg.RootImageDir) || filepath.Clean(cfg.RootImageDir) != cfg.RootImageDir):
		return fmt.Errorf("root image dir %q is not a clean absolute path", cfg.RootImageDir)
	case !validCgroupParent(cfg.CgroupParent):
		return fmt.Errorf("cgroup parent %q: want an absolute path below the cgroup root, like /aenv-x", cfg.CgroupParent)
	}
	switch cfg.Platform {
	case PlatformSystrap, PlatformKVM, PlatformAuto:
		return nil
	}
	return fmt.Errorf("platform %q: want %s, %s or %s", cfg.Platform, PlatformSystrap, PlatformKVM, PlatformAuto)
}

// validCgroupParent rejects the cgroup root itself and paths that are not
// clean: Cleanup deletes children of this path.
func validCgroupParent(p string) bool {
	return strings.HasPrefix(p, "/") && p != "/" && filepath.Clean(p) == p
}
