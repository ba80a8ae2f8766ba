package template

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// rootfsIDFile sits beside a root filesystem (in the directory holding
// <dir>/rootfs) and names its contents.
const rootfsIDFile = "rootfs-id"

// RootfsID names the contents of the root filesystem at rootfs, the same
// on every node that has those contents: a snapshot restored on another
// node needs exactly the files it was taken over, and a base template
// debootstrapped on two machines differs in small ways. The name is made
// once, at random, and kept in a file beside the rootfs; a rootfs fetched
// from another node keeps the name it had there (SetRootfsID). Nodes that
// share a build cache share the names of its root filesystems.
func RootfsID(rootfs string) (string, error) {
	path := filepath.Join(filepath.Dir(rootfs), rootfsIDFile)
	if id, err := readRootfsID(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return id, err
	}
	raw := make([]byte, 12)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("rootfs id: %w", err)
	}
	if err := SetRootfsID(rootfs, "rootfs-"+hex.EncodeToString(raw)); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	// Another process may have named it first: its name is the one.
	return readRootfsID(path)
}

// SetRootfsID records id as the name of rootfs's contents; fs.ErrExist if
// it has one already.
func SetRootfsID(rootfs, id string) error {
	dir := filepath.Dir(rootfs)
	tmp, err := os.CreateTemp(dir, ".rootfs-id-*")
	if err != nil {
		return fmt.Errorf("rootfs id: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(id + "\n"); err != nil {
		tmp.Close()
		return fmt.Errorf("rootfs id: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("rootfs id: %w", err)
	}
	// A hard link never replaces: of racing writers, one wins whole.
	if err := os.Link(tmp.Name(), filepath.Join(dir, rootfsIDFile)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return err
		}
		return fmt.Errorf("rootfs id: %w", err)
	}
	return nil
}

func readRootfsID(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(raw))
	if id == "" {
		return "", fmt.Errorf("rootfs id: %s is empty", path)
	}
	return id, nil
}
