// Package compose_test checks deploy/compose/compose.yaml: it loads as the
// Compose specification says (schema, interpolation), and what it tells
// aenv (AENV_* variables, images, paths) is what aenv and its images take.
package compose_test

import (
	"context"
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
	for _, n := range []string{"node-a", "node-b"} {
		s := p.Services[n]
		checkVars(n, nodeVars)
		if !s.Privileged || s.Cgroup != "host" {
			t.Errorf("%s: privileged %v cgroup %q: a node needs both", n, s.Privileged, s.Cgroup)
		}
		if s.Image != "ghcr.io/aenv-dev/aenv-node:latest" {
			t.Errorf("%s image %q, not what make images names it", n, s.Image)
		}
		id := *s.Environment["AENV_NODE_ID"]
		if id != n || *s.Environment["AENV_ADVERTISE"] != s.Hostname+":8000" || s.Hostname != n {
			t.Errorf("%s: node ID %q, advertised %q, host name %q", n, id, *s.Environment["AENV_ADVERTISE"], s.Hostname)
		}
		if other, dup := seen[id]; dup {
			t.Errorf("%s and %s share node ID %s", n, other, id)
		}
		seen[id] = n
		if !slices.ContainsFunc(s.Volumes, func(v types.ServiceVolumeConfig) bool { return v.Target == dataDir }) {
			t.Errorf("%s keeps no volume at the image's data dir %s", n, dataDir)
		}
		if dsn := *s.Environment["AENV_DATABASE_URL"]; !strings.Contains(dsn, ":pw@postgres:5432/") {
			t.Errorf("%s database %q", n, dsn)
		}
	}
	g := p.Services["gateway"]
	checkVars("gateway", gatewayVars)
	if g.Privileged || g.Image != "ghcr.io/aenv-dev/aenv-gateway:latest" {
		t.Errorf("gateway: privileged %v image %q", g.Privileged, g.Image)
	}
	if len(g.Ports) != 1 || g.Ports[0].Target != 8000 || g.Ports[0].Published != "8000" {
		t.Errorf("gateway ports %+v", g.Ports)
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
		{"wrong type", `      - "8000:8000"`, "      - {target: eight}", "target"},
		{"unknown service key", "    hostname: node-a", "    hostnam: node-a", "hostnam"},
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
