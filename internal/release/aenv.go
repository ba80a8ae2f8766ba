package release

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Inputs are what aenv's images are made of.
type Inputs struct {
	// BinDir holds the static aenv, envd and runsc (make build's bin/).
	BinDir string
	// NodeBase is the node image's root filesystem: a Debian with what
	// aenv runs (debootstrap, its keyring, CA certificates). Required
	// for the node image.
	NodeBase string
	// CACerts is the gateway's CA bundle (it reaches PostgreSQL and nodes
	// over TLS when told to), copied from the build machine.
	CACerts string
	Version string
	// Repository prefixes the images' names, e.g. "ghcr.io/aenv-dev".
	Repository string
	Created    time.Time
}

// The ports and paths the images are set up for: the API on 8000, data
// in /var/lib/aenv, the binaries where scripts/install.sh puts them.
const (
	apiPort = "8000/tcp"
	dataDir = "/var/lib/aenv"
	binDir  = "/usr/local/bin"
)

func (in Inputs) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":   "aenv",
		"org.opencontainers.image.version": in.Version,
		"org.opencontainers.image.source":  "https://github.com/aenv-dev/aenv",
		"org.opencontainers.image.created": in.Created.UTC().Format(time.RFC3339),
	}
}

// GatewaySpec is the gateway's image: the static aenv alone, run as an
// unprivileged user, with a CA bundle. It reads its settings from AENV_*
// variables (the database URL, the secrets key).
func GatewaySpec(in Inputs) Spec {
	return Spec{
		Skeleton: map[string][]byte{
			"/etc/passwd": fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n",
				NonRootUID, NonRootUID),
			"/etc/group":         fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", NonRootUID),
			"/etc/nsswitch.conf": []byte("hosts: files dns\n"),
		},
		Dirs:         map[string]os.FileMode{"/tmp": 0o777 | os.ModeSticky, "/home/nonroot": 0o755},
		Files:        []File{{Src: filepath.Join(in.BinDir, "aenv"), Dst: binDir + "/aenv", Mode: 0o755}, {Src: in.CACerts, Dst: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644}},
		Entrypoint:   []string{binDir + "/aenv", "gateway"},
		User:         fmt.Sprintf("%d:%d", NonRootUID, NonRootUID),
		Env:          []string{"PATH=" + binDir + ":/usr/bin:/bin", "AENV_LISTEN=:8000"},
		ExposedPorts: []string{apiPort},
		Labels:       in.labels(),
	}
}

// NodeSpec is a node's image: a Debian with aenv, envd and runsc. A node
// runs sandboxes, so its container needs root and privileges (see
// deploy/kubernetes); its data directory is a volume.
func NodeSpec(in Inputs) Spec {
	files := make([]File, 0, 3)
	for _, b := range []string{"aenv", "envd", "runsc"} {
		files = append(files, File{Src: filepath.Join(in.BinDir, b), Dst: binDir + "/" + b, Mode: 0o755})
	}
	return Spec{
		Base:         in.NodeBase,
		Dirs:         map[string]os.FileMode{dataDir: 0o700},
		Files:        files,
		Entrypoint:   []string{binDir + "/aenv", "node"},
		Env:          []string{"PATH=" + binDir + ":/usr/sbin:/usr/bin:/sbin:/bin", "AENV_LISTEN=:8000", "AENV_DATA_DIR=" + dataDir},
		ExposedPorts: []string{apiPort},
		Volumes:      []string{dataDir},
		Labels:       in.labels(),
	}
}

// Built is an image made, with the name it is tagged with.
type Built struct {
	Ref   name.Tag
	Image v1.Image
}

// BuildAll makes the gateway image and, when in.NodeBase is set, the
// node image, tagged <repository>/aenv-gateway:<version> and
// <repository>/aenv-node:<version>. Layer files go into tmpDir.
func BuildAll(in Inputs, tmpDir string) ([]Built, error) {
	specs := []struct {
		name string
		spec Spec
	}{{"aenv-gateway", GatewaySpec(in)}}
	if in.NodeBase != "" {
		specs = append(specs, struct {
			name string
			spec Spec
		}{"aenv-node", NodeSpec(in)})
	}
	var out []Built
	for _, s := range specs {
		ref, err := name.NewTag(fmt.Sprintf("%s/%s:%s", in.Repository, s.name, in.Version))
		if err != nil {
			return nil, fmt.Errorf("image name: %w", err)
		}
		img, err := Build(s.spec, in.Created, tmpDir)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		out = append(out, Built{Ref: ref, Image: img})
	}
	return out, nil
}

// Write puts the images into dir: an OCI layout (dir/oci, each image
// annotated with its name) and, per image, a tarball that `docker load`
// and `podman load` take (dir/<name>.tar).
func Write(dir string, images []Built) error {
	p, err := layout.Write(filepath.Join(dir, "oci"), empty.Index)
	if err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	for _, b := range images {
		if err := p.AppendImage(b.Image, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": b.Ref.String(),
		})); err != nil {
			return fmt.Errorf("OCI layout: %s: %w", b.Ref, err)
		}
		file := filepath.Join(dir, filepath.Base(b.Ref.RepositoryStr())+".tar")
		if err := tarball.WriteToFile(file, b.Ref, b.Image); err != nil {
			return fmt.Errorf("tarball %s: %w", file, err)
		}
	}
	return nil
}
