// Package systemd_test checks the systemd units beside it and
// scripts/install.sh, which installs them: the layout the script lays down
// in a staging root (DESTDIR), the units as systemd-analyze verifies them,
// the gateway's hardening, refusals that leave nothing behind, and an
// uninstall that keeps the configuration and the data unless purged.
package systemd_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/roottest"
)

const installScript = "../../scripts/install.sh"

var (
	units    = []string{"aenv.service", "aenv-node.service", "aenv-gateway.service"}
	binaries = []string{"aenv", "envd", "runsc"}
	// commands is what each unit runs.
	commands = map[string]string{"aenv.service": "server", "aenv-node.service": "node", "aenv-gateway.service": "gateway"}
)

// fakeBinDir makes executables standing in for bin/aenv, envd and runsc:
// the script copies them, systemd-analyze only checks they are executable.
func fakeBinDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range binaries {
		if err := os.WriteFile(filepath.Join(dir, b), []byte("#!/bin/sh\n# "+b+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runInstall runs scripts/install.sh with args and extra environment, and
// returns its output and error.
func runInstall(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{installScript}, args...)...)
	// The staging root comes from --destdir only; PREFIX and DESTDIR of the
	// test's own environment must not leak in.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PREFIX=") && !strings.HasPrefix(kv, "DESTDIR=") && !strings.HasPrefix(kv, "AENV_INSTALL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// tree lists the files and directories under root with their modes.
func tree(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	got := map[string]fs.FileMode{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		got["/"+rel] = info.Mode()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// unitLines returns the values of key in a unit file, in order.
func unitLines(unit, key string) []string {
	var vals []string
	for _, line := range strings.Split(unit, "\n") {
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			vals = append(vals, v)
		}
	}
	return vals
}

func TestInstallLayout(t *testing.T) {
	bin := fakeBinDir(t)
	for _, prefix := range []string{"/usr/local", "/opt/aenv"} {
		t.Run(prefix, func(t *testing.T) {
			root := t.TempDir()
			if out, err := runInstall(t, nil, "--destdir", root, "--prefix", prefix, "--bin-dir", bin); err != nil {
				t.Fatalf("install: %v\n%s", err, out)
			}
			want := map[string]fs.FileMode{
				"/etc":                                     fs.ModeDir | 0o755,
				"/etc/aenv":                                fs.ModeDir | 0o755,
				"/etc/aenv/aenv.env":                       0o600,
				"/etc/systemd":                             fs.ModeDir | 0o755,
				"/etc/systemd/system":                      fs.ModeDir | 0o755,
				"/etc/systemd/system/aenv.service":         0o644,
				"/etc/systemd/system/aenv-node.service":    0o644,
				"/etc/systemd/system/aenv-gateway.service": 0o644,
			}
			for p := prefix; p != "/"; p = filepath.Dir(p) {
				want[p] = fs.ModeDir | 0o755
			}
			want[prefix+"/bin"] = fs.ModeDir | 0o755
			for _, b := range binaries {
				want[prefix+"/bin/"+b] = 0o755
			}
			got := tree(t, root)
			for p, m := range want {
				if got[p] != m {
					t.Errorf("%s: mode %v, want %v", p, got[p], m)
				}
			}
			for p := range got {
				if _, ok := want[p]; !ok {
					t.Errorf("unexpected %s", p)
				}
			}
			for _, b := range binaries {
				if readFile(t, filepath.Join(root, prefix, "bin", b)) != readFile(t, filepath.Join(bin, b)) {
					t.Errorf("%s/bin/%s is not bin/%s", prefix, b, b)
				}
			}
			for _, u := range units {
				unit := readFile(t, filepath.Join(root, "etc/systemd/system", u))
				if got, want := unitLines(unit, "ExecStart"), []string{prefix + "/bin/aenv " + commands[u]}; !slices.Equal(got, want) {
					t.Errorf("%s: ExecStart %q, want %q", u, got, want)
				}
				if got := unitLines(unit, "EnvironmentFile"); len(got) == 0 || got[0] != "/etc/aenv/aenv.env" {
					t.Errorf("%s: EnvironmentFile %q, want /etc/aenv/aenv.env first", u, got)
				}
				if strings.Contains(unit, "@BINDIR@") {
					t.Errorf("%s: @BINDIR@ left in", u)
				}
			}
			if readFile(t, filepath.Join(root, "etc/aenv/aenv.env")) != readFile(t, "aenv.env") {
				t.Errorf("/etc/aenv/aenv.env is not deploy/systemd/aenv.env")
			}

			// An upgrade keeps the operator's environment file.
			mine := "AENV_LISTEN=:9000\n"
			if err := os.WriteFile(filepath.Join(root, "etc/aenv/aenv.env"), []byte(mine), 0o600); err != nil {
				t.Fatal(err)
			}
			if out, err := runInstall(t, nil, "--destdir", root, "--prefix", prefix, "--bin-dir", bin); err != nil {
				t.Fatalf("install again: %v\n%s", err, out)
			}
			if got := readFile(t, filepath.Join(root, "etc/aenv/aenv.env")); got != mine {
				t.Errorf("a second install rewrote aenv.env: %q", got)
			}
		})
	}
}

// requireSystemdAnalyze skips without systemd-analyze on a developer's
// machine; CI and make test install it (scripts/install-deps.sh), so there
// its absence fails.
func requireSystemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") != "" || os.Getenv("AENV_REQUIRE_ROOT_TESTS") == "1" {
			t.Fatal("systemd-analyze is missing: scripts/install-deps.sh installs it (package systemd)")
		}
		t.Skip("systemd-analyze is missing (package systemd)")
	}
	return p
}

// installedUnits installs into a staging root and returns a directory of
// the units with their ExecStart pointing into that root, where the
// binaries are: systemd-analyze checks they exist.
func installedUnits(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if out, err := runInstall(t, nil, "--destdir", root, "--bin-dir", fakeBinDir(t)); err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	dir := t.TempDir()
	for _, u := range units {
		unit := readFile(t, filepath.Join(root, "etc/systemd/system", u))
		unit = strings.ReplaceAll(unit, "ExecStart=/usr/local/bin/", "ExecStart="+root+"/usr/local/bin/")
		if err := os.WriteFile(filepath.Join(dir, u), []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// verify runs systemd-analyze verify on units; any word it says is a
// finding (it exits 0 on an unknown key, which it only warns about).
func verify(t *testing.T, analyze string, paths ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(analyze, append([]string{"verify"}, paths...)...)
	// Without a running systemd it needs no bus; it must not try one.
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_LEVEL=warning")
	out, err := cmd.CombinedOutput()
	return string(bytes.TrimSpace(out)), err
}

func TestUnitsVerify(t *testing.T) {
	analyze := requireSystemdAnalyze(t)
	dir := installedUnits(t)
	var paths []string
	for _, u := range units {
		paths = append(paths, filepath.Join(dir, u))
	}
	if out, err := verify(t, analyze, paths...); err != nil || out != "" {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}

	// The check sees a mistake: a misspelled key is only a warning.
	bad := filepath.Join(t.TempDir(), "aenv-gateway.service")
	unit := strings.Replace(readFile(t, paths[2]), "ProtectSystem=strict", "ProtectSystm=strict", 1)
	if err := os.WriteFile(bad, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := verify(t, analyze, bad); !strings.Contains(out, "ProtectSystm") {
		t.Errorf("systemd-analyze verify let a misspelled key pass: %q", out)
	}

	// The gateway is hardened: systemd rates its exposure 2.0 or below
	// (of 10; the threshold is in tenths).
	cmd := exec.Command(analyze, "security", "--offline=yes", "--threshold=20", paths[2])
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("systemd-analyze security of aenv-gateway.service: exposure above 2.0: %v\n%s", err, out)
	}
}

// TestInstallRefusesUnsupported checks that each unsupported system is
// refused with a message naming the reason, before anything is written.
func TestInstallRefusesUnsupported(t *testing.T) {
	bin := fakeBinDir(t)
	osRelease := func(content string) string {
		p := filepath.Join(t.TempDir(), "os-release")
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		env  []string
		bin  string
		want string
	}{
		{"fedora", []string{"AENV_INSTALL_OS_RELEASE=" + osRelease("ID=fedora\nID_LIKE=\"rhel centos\"\n")}, bin, "unsupported system 'fedora rhel centos'"},
		{"no os-release", []string{"AENV_INSTALL_OS_RELEASE=/nonexistent"}, bin, "unsupported system"},
		{"riscv64", []string{"AENV_INSTALL_ARCH=riscv64"}, bin, "unsupported architecture riscv64"},
		{"no systemd", []string{"AENV_INSTALL_SYSTEMCTL="}, bin, "systemd is not installed"},
		{"not built", nil, t.TempDir(), "run make build first"},
	}
	// A supported system, for the other probes' sake: Ubuntu says ID_LIKE=debian.
	ubuntu := "AENV_INSTALL_OS_RELEASE=" + osRelease("ID=ubuntu\nID_LIKE=debian\n")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			env := append([]string{ubuntu, "AENV_INSTALL_ARCH=x86_64"}, tt.env...)
			out, err := runInstall(t, env, "--destdir", root, "--bin-dir", tt.bin)
			if err == nil {
				t.Fatalf("install succeeded:\n%s", out)
			}
			if !strings.Contains(out, tt.want) || !strings.Contains(out, "nothing was changed") {
				t.Errorf("output %q does not say %q and that nothing was changed", out, tt.want)
			}
			if got := tree(t, root); len(got) != 0 {
				t.Errorf("refused install left %v", got)
			}
		})
	}
	// The same probes accept Debian and Ubuntu on amd64 and arm64.
	for _, env := range [][]string{
		{ubuntu, "AENV_INSTALL_ARCH=aarch64"},
		{"AENV_INSTALL_OS_RELEASE=" + osRelease("ID=debian\n"), "AENV_INSTALL_ARCH=x86_64"},
	} {
		if out, err := runInstall(t, env, "--destdir", t.TempDir(), "--bin-dir", bin); err != nil {
			t.Errorf("install with %v refused: %v\n%s", env, err, out)
		}
	}
}

// TestInstallRefusesNonRoot runs the script as an ordinary user onto the
// real system (no --destdir), whose paths are redirected into a temporary
// directory should the refusal fail. The user runs a copy of the script
// that it can read wherever the checkout is.
func TestInstallRefusesNonRoot(t *testing.T) {
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		cred = &syscall.Credential{Uid: 65534, Gid: 65534} // nobody
	}
	dir := t.TempDir()
	// t.TempDir's parent is private to root too.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	repo := filepath.Join(dir, "repo")
	files := []string{"scripts/install.sh", "scripts/install-deps.sh", "deploy/systemd/aenv.env"}
	for _, u := range units {
		files = append(files, "deploy/systemd/"+u)
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join("../..", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(repo, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(repo, f), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	target := filepath.Join(dir, "target")
	// Writable by the user: a failed refusal would show as files here.
	if err := os.Mkdir(target, 0o755); err != nil || os.Chmod(target, 0o777) != nil {
		t.Fatal("make target dir:", err)
	}
	cmd := exec.Command("bash", filepath.Join(repo, "scripts/install.sh"), "--prefix", filepath.Join(target, "prefix"),
		"--unit-dir", filepath.Join(target, "units"), "--bin-dir", fakeBinDir(t), "--no-deps")
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	outb, err := cmd.CombinedOutput()
	out := string(outb)
	if err == nil {
		t.Fatalf("install as a user succeeded:\n%s", out)
	}
	if !strings.Contains(out, "run as root") || !strings.Contains(out, "nothing was changed") {
		t.Errorf("output %q does not ask for root", out)
	}
	if got := tree(t, target); len(got) != 0 {
		t.Errorf("refused install left %v", got)
	}
}

func TestUninstall(t *testing.T) {
	bin := fakeBinDir(t)
	root := t.TempDir()
	if out, err := runInstall(t, nil, "--destdir", root, "--bin-dir", bin); err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	data := filepath.Join(root, "var/lib/aenv")
	if err := os.MkdirAll(filepath.Join(data, "templates"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "aenv.db"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	if out, err := runInstall(t, nil, "--destdir", root, "--uninstall"); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	kept := []string{"/etc/aenv/aenv.env", "/var/lib/aenv/aenv.db", "/var/lib/aenv/templates"}
	got := tree(t, root)
	for _, p := range kept {
		if _, ok := got[p]; !ok {
			t.Errorf("uninstall removed %s", p)
		}
	}
	for p, m := range got {
		if !m.IsDir() && !slices.Contains(kept, p) {
			t.Errorf("uninstall left %s", p)
		}
	}

	if out, err := runInstall(t, nil, "--destdir", root, "--uninstall", "--purge"); err != nil {
		t.Fatalf("purge: %v\n%s", err, out)
	}
	for p, m := range tree(t, root) {
		if !m.IsDir() || strings.HasPrefix(p, "/etc/aenv") || strings.HasPrefix(p, "/var/lib/aenv") {
			t.Errorf("purge left %s", p)
		}
	}
}

// TestPurgeRefusesWithMounts: a sandbox left running holds mounts in the
// data dir; a purge must stop before removing anything rather than reach
// into them.
func TestPurgeRefusesWithMounts(t *testing.T) {
	roottest.Require(t)
	root := t.TempDir()
	if out, err := runInstall(t, nil, "--destdir", root, "--bin-dir", fakeBinDir(t)); err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	mnt := filepath.Join(root, "var/lib/aenv/sandbox")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "file"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runInstall(t, nil, "--destdir", root, "--uninstall", "--purge")
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	if err == nil || !strings.Contains(out, "sandboxes still hold mounts") || !strings.Contains(out, "nothing was changed") {
		t.Errorf("purge with a mount in the data dir: %v\n%s", err, out)
	}
	for _, p := range []string{"etc/aenv/aenv.env", "usr/local/bin/aenv", "etc/systemd/system/aenv.service"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("refused purge removed %s: %v", p, err)
		}
	}
}

// TestPurgeDataDirs: a purge removes the data dir every unit's environment
// file names, and refuses, before removing anything, one that aenv did
// not make (a data dir set to a shared directory such as /srv).
func TestPurgeDataDirs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ours    bool // the node's data dir holds aenv's lock file
		wantErr string
	}{
		{"node data dir elsewhere", true, ""},
		{"data dir not aenv's", false, "refusing to purge"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if out, err := runInstall(t, nil, "--destdir", root, "--bin-dir", fakeBinDir(t)); err != nil {
				t.Fatalf("install: %v\n%s", err, out)
			}
			if err := os.WriteFile(filepath.Join(root, "etc/aenv/node.env"), []byte("AENV_DATA_DIR=/srv\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			srv := filepath.Join(root, "srv")
			other := filepath.Join(srv, "someone-elses")
			if err := os.MkdirAll(other, 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.ours {
				if err := os.WriteFile(filepath.Join(srv, "lock"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			out, err := runInstall(t, nil, "--destdir", root, "--uninstall", "--purge")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(out, tc.wantErr) || !strings.Contains(out, "nothing was changed") {
					t.Fatalf("purge: %v\n%s", err, out)
				}
				for _, p := range []string{other, filepath.Join(root, "etc/aenv/aenv.env"), filepath.Join(root, "usr/local/bin/aenv")} {
					if _, err := os.Stat(p); err != nil {
						t.Errorf("refused purge removed %s", p)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("purge: %v\n%s", err, out)
			}
			if _, err := os.Stat(srv); !os.IsNotExist(err) {
				t.Errorf("purge kept the node's data dir named in node.env: %v", err)
			}
		})
	}
}
