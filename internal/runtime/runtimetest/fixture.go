package runtimetest

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/runtime"
)

const fakeEnvdPackage = "github.com/aenv-dev/aenv/internal/runtime/runtimetest/fakeenvd"

// buildFakeEnvd builds the static fakeenvd binary into a temporary dir.
func buildFakeEnvd(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fakeenvd")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin, fakeEnvdPackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build fakeenvd: %v: %s", err, out)
	}
	return bin
}

// minimalRootfs makes a root filesystem of empty directories: fakeenvd is
// static and needs nothing else.
func minimalRootfs(t testing.TB) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	for _, dir := range []string{"proc", "dev", "sys", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := runtime.PrepareRootfs(root); err != nil {
		t.Fatal(err)
	}
	return root
}

// treeListing records every entry's mode, size and modification time
// under root, to detect any change to a template rootfs.
func treeListing(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out[path] = fmt.Sprintf("%v %d %d", info.Mode(), info.Size(), info.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatalf("list %s: %v", root, err)
	}
	return out
}

// treeChanges describes how listing after differs from before.
func treeChanges(before, after map[string]string) []string {
	var changes []string
	for path, b := range before {
		if a, ok := after[path]; !ok {
			changes = append(changes, "removed "+path)
		} else if a != b {
			changes = append(changes, fmt.Sprintf("changed %s: %s -> %s", path, b, a))
		}
	}
	for path := range after {
		if _, ok := before[path]; !ok {
			changes = append(changes, "added "+path)
		}
	}
	slices.Sort(changes)
	return changes
}

// leftovers lists what remains on the host of a driver after its final
// Cleanup: processes naming the state dir, mounts below it, cgroups below
// the cgroup parent.
func leftovers(t testing.TB, env TestEnv) []string {
	t.Helper()
	var found []string
	stateDir := []byte(filepath.Clean(env.StateDir))
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, path := range cmdlines {
		b, err := os.ReadFile(path)
		if err == nil && bytes.Contains(b, stateDir) && filepath.Dir(path) != fmt.Sprintf("/proc/%d", os.Getpid()) {
			found = append(found, "process "+filepath.Dir(path)+": "+string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mountinfo), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4]+"/", filepath.Clean(env.StateDir)+"/") {
			found = append(found, "mount "+f[4])
		}
	}
	if env.CgroupParent != "" {
		for _, pattern := range []string{"/sys/fs/cgroup" + env.CgroupParent + "/*", "/sys/fs/cgroup/*" + env.CgroupParent + "/*"} {
			dirs, _ := filepath.Glob(pattern)
			for _, d := range dirs {
				if info, err := os.Stat(d); err == nil && info.IsDir() {
					found = append(found, "cgroup "+d)
				}
			}
		}
	}
	return found
}
