// Package compose_test checks deploy/compose/compose.yaml: it loads as the
// Compose specification says (schema, interpolation), and what it tells
// aenv (AENV_* variables, images, paths) is what aenv and its images take.
package compose_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/spf13/pflag"

	"github.com/aenv-dev/aenv/internal/config"
	"github.com/aenv-dev/aenv/internal/release"
)

// env is what an operator's .env gives.
var env = map[string]string{"POSTGRES_PASSWORD": "pw", "AENV_API_KEY": "key"}

func load(t *testing.T, file string, env map[string]string) (*types.Project, error) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  filepath.Dir(file),
		ConfigFiles: []types.ConfigFile{{Filename: file, Content: raw}},
		Environment: env,
	}, func(o *loader.Options) { o.SetProjectName("aenv", true) })
}

// flagEnv is the AENV_* variable of every flag of a command.
func flagEnv(register ...func(*pflag.FlagSet)) map[string]bool {
	fs := pflag.NewFlagSet("", pflag.ContinueOnError)
	for _, r := range register {
		r(fs)
	}
	out := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) { out[config.EnvName(f.Name)] = true })
	return out
}

func TestComposeFile(t *testing.T) {
	p, err := load(t, "compose.yaml", env)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range p.Services {
		names = append(names, n)
	}
	slices.Sort(names)
	if strings.Join(names, ",") != "gateway,node-a,node-b,postgres,s3" {
		t.Fatalf("services %v", names)
	}

	srv, cl, gw := config.Default(), config.DefaultCluster(), config.Gateway{}
	nodeVars := flagEnv(srv.RegisterFlags, cl.RegisterFlags)
	gatewayVars := flagEnv(gw.RegisterFlags)
	images := release.Inputs{Repository: "ghcr.io/aenv-dev", Version: "latest"}
	nodeImage := release.NodeSpec(images)
	dataDir := ""
	for _, e := range nodeImage.Env {
		if v, ok := strings.CutPrefix(e, "AENV_DATA_DIR="); ok {
			dataDir = v
		}
	}

	checkVars := func(service string, known map[string]bool) {
		for k := range p.Services[service].Environment {
			if strings.HasPrefix(k, "AENV_") && !known[k] {
				t.Errorf("%s sets %s, which is no flag of its command", service, k)
			}
		}
	}
	seen := map[string]string{}
	var ranges []*net.IPNet
	for _, n := range []string{"node-a", "node-b"} {
		s := p.Services[n]
		checkVars(n, nodeVars)
		// What keeps sandboxes alive across a restart of the container:
		// TestComposeClusterInPodman runs the nodes with these settings.
		if !s.Privileged || s.Cgroup != "host" || s.NetworkMode != "host" || s.Pid != "host" {
			t.Errorf("%s: privileged %v, cgroup %q, network %q, pid %q: a node needs all four", n,
				s.Privileged, s.Cgroup, s.NetworkMode, s.Pid)
		}
		if s.Image != "ghcr.io/aenv-dev/aenv-node:latest" {
			t.Errorf("%s image %q, not what make images names it", n, s.Image)
		}
		mounts := map[string]types.ServiceVolumeConfig{}
		for _, v := range s.Volumes {
			mounts[v.Target] = v
		}
		env := func(k string) string {
			if v := s.Environment[k]; v != nil {
				return *v
			}
			return ""
		}
		// The node's data directory is at the host's path: a node names
		// its cgroups and finds its processes by it, among the host's.
		data := env("AENV_DATA_DIR")
		if data == "" || data == dataDir || mounts[data].Source != data {
			t.Errorf("%s: data directory %q (mounted from %q), want a host directory at its own path, not the image's %s",
				n, data, mounts[data].Source, dataDir)
		}
		for _, want := range []struct{ target, propagation string }{
			{data, "rshared"}, {"/run/netns", "rshared"}, {"/sys/fs/cgroup", ""},
		} {
			v, ok := mounts[want.target]
			if !ok || v.Type != types.VolumeTypeBind {
				t.Errorf("%s: no host directory at %s (%+v)", n, want.target, v)
				continue
			}
			propagation := ""
			if v.Bind != nil {
				propagation = v.Bind.Propagation
			}
			if propagation != want.propagation {
				t.Errorf("%s: %s shared %q, want %q", n, want.target, propagation, want.propagation)
			}
		}
		id, listen := env("AENV_NODE_ID"), env("AENV_LISTEN")
		if id != n || env("AENV_ADVERTISE") != listen {
			t.Errorf("%s: node ID %q, advertised %q, listening on %q", n, id, env("AENV_ADVERTISE"), listen)
		}
		// On one host's network, two nodes differ in everything they own.
		for _, k := range []string{"AENV_NODE_ID", "AENV_LISTEN", "AENV_NET_PREFIX", "AENV_DATA_DIR"} {
			v := k
			if strings.HasPrefix(k, "AENV_") {
				v = k + "=" + env(k)
			}
			if other, dup := seen[v]; dup || v == k+"=" {
				t.Errorf("%s and %s share %s", n, other, v)
			}
			seen[v] = n
		}
		_, cidr, err := net.ParseCIDR(env("AENV_SANDBOX_CIDR"))
		if err != nil {
			t.Errorf("%s: sandbox range: %v", n, err)
			continue
		}
		for _, r := range ranges {
			if r.Contains(cidr.IP) || cidr.Contains(r.IP) {
				t.Errorf("%s: sandbox range %s overlaps %s", n, cidr, r)
			}
		}
		ranges = append(ranges, cidr)
		if dsn := env("AENV_DATABASE_URL"); !strings.Contains(dsn, ":pw@127.0.0.1:5432/") {
			t.Errorf("%s database %q", n, dsn)
		}
	}
	for _, n := range []string{"postgres", "s3"} {
		for _, port := range p.Services[n].Ports {
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s published on %q, want the loopback only", n, port.HostIP)
			}
		}
	}
	g := p.Services["gateway"]
	checkVars("gateway", gatewayVars)
	if g.Privileged || g.Image != "ghcr.io/aenv-dev/aenv-gateway:latest" {
		t.Errorf("gateway: privileged %v image %q", g.Privileged, g.Image)
	}
	if g.NetworkMode != "host" || *g.Environment["AENV_LISTEN"] != ":8000" {
		t.Errorf("gateway network %q, listening on %v", g.NetworkMode, g.Environment["AENV_LISTEN"])
	}
	if *g.Environment["AENV_API_KEY"] != "key" {
		t.Errorf("gateway API key %v", g.Environment["AENV_API_KEY"])
	}
}

// Forgotten settings and mistakes in the file are refused, not run.
func TestComposeFileMistakes(t *testing.T) {
	if _, err := load(t, "compose.yaml", map[string]string{"AENV_API_KEY": "key"}); err == nil ||
		!strings.Contains(err.Error(), "POSTGRES_PASSWORD") {
		t.Errorf("no database password: %v", err)
	}
	raw, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, from, to, want string }{
		{"misspelled key", "  privileged: true", "  privilegd: true", "privilegd"},
		{"wrong type", `      - "127.0.0.1:${AENV_S3_PORT:-8333}:8333"`, "      - {target: eight}", "target"},
		{"unknown service key", "    network_mode: host", "    network_mod: host", "network_mod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(string(raw), tc.from) {
				t.Fatalf("compose.yaml no longer has %q", tc.from)
			}
			file := filepath.Join(t.TempDir(), "compose.yaml")
			if err := os.WriteFile(file, []byte(strings.Replace(string(raw), tc.from, tc.to, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := load(t, file, env); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("loaded with %s: %v", tc.name, err)
			}
		})
	}
}
