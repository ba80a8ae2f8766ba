// Package image pulls OCI and Docker images from registries into a
// content-addressed layer store, and unpacks them into root filesystems.
//
// Layers are kept as the registry serves them (compressed), named by digest,
// so images sharing a base layer store it once. Unpacking applies the layers
// in order with OCI whiteout semantics and refuses any entry that would
// write outside the target directory.
package image

import (
	"net/http"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
)

// Errors returned (wrapped) by Pull, each of a kind (internal/errdefs) that
// the API maps to a status.
var (
	ErrInvalidReference = errdefs.New(errdefs.ErrInvalidArgument, "invalid image reference")
	ErrNotFound         = errdefs.New(errdefs.ErrNotFound, "image not found")
	ErrUnauthorized     = errdefs.New(errdefs.ErrPermissionDenied, "registry denied access")
	ErrUnreachable      = errdefs.New(errdefs.ErrBadGateway, "registry unreachable")
	ErrNoPlatform       = errdefs.New(errdefs.ErrInvalidArgument, "image has no variant for the platform")
	ErrUnsafePath       = errdefs.New(errdefs.ErrInvalidArgument, "layer entry escapes the root filesystem")
	// ErrInvalidLayer is a layer the image's author got wrong: not a
	// tar stream, or a hard link to nothing the layers made before it.
	ErrInvalidLayer = errdefs.New(errdefs.ErrInvalidArgument, "invalid image layer")
	// ErrTooLarge is a layer that unpacks beyond the Limits.
	ErrTooLarge = errdefs.New(errdefs.ErrTooLarge, "image too large to unpack")
	// ErrCorruptLayer is a stored layer whose content no longer has its
	// digest (the disk's fault, not the image's). The blob is removed, so
	// that pulling again fetches it anew.
	ErrCorruptLayer = errdefs.New(errdefs.ErrUnavailable, "stored layer is corrupt")
)

// DefaultPlatform is the platform pulled when PullOptions.Platform is empty.
const DefaultPlatform = "linux/amd64"

// Progress phases.
const (
	PhaseResolving   = "resolving"   // fetching the manifest
	PhaseDownloading = "downloading" // Current bytes of Total fetched
	PhaseCached      = "cached"      // layer already in the store
	PhaseDownloaded  = "downloaded"  // layer fully fetched and verified
)

// Progress reports a step of a pull. Layer is the layer digest, empty for
// image-wide phases.
type Progress struct {
	Phase   string
	Layer   string
	Current int64
	Total   int64
}

// PullOptions configure Pull.
type PullOptions struct {
	// LayerDir is the content-addressed layer store, shared between images.
	LayerDir string
	// Platform is "os/arch[/variant]", e.g. linux/arm64; "" means linux/amd64.
	Platform string
	// Keychain supplies registry credentials; nil means the user's Docker
	// config (authn.DefaultKeychain).
	Keychain authn.Keychain
	// Registries says which addresses the pull may connect to. It applies
	// when Transport is nil.
	Registries RegistryPolicy
	// Transport overrides the HTTP transport, which then makes its own
	// checks; nil means one that enforces Registries.
	Transport http.RoundTripper
	// Progress, if set, is called for each step; calls never overlap.
	Progress func(Progress)
	// Jobs is how many layers download at once; 0 means 3.
	Jobs int
}

// Limits bound what unpacking an image writes: a few megabytes of gzip can
// hold gigabytes of zeros, and a root filesystem is written to the
// server's disk.
type Limits struct {
	// MaxBytes bounds the image's unpacked size, all layers together:
	// the size of each file plus a tar block (512 bytes) per entry, so
	// that millions of empty files count too. 0 means no bound.
	MaxBytes int64
	// MaxRatio bounds each layer's unpacked size (counted as for
	// MaxBytes) to MaxRatio times its stored, compressed size, but never
	// below RatioFloor, so that small layers are never refused for their
	// ratio. 0 means no bound.
	MaxRatio   int64
	RatioFloor int64
}

// DefaultLimits are the Limits a server uses unless its operator says
// otherwise: ordinary layers expand 2 to 10 times; 100 times is a layer
// built to fill the disk.
func DefaultLimits() Limits {
	return Limits{MaxBytes: 16 << 30, MaxRatio: 100, RatioFloor: 64 << 20}
}

// Image is a pulled image: its layers are in the store at LayerDir.
type Image struct {
	Reference string  `json:"reference"` // fully qualified, e.g. index.docker.io/library/ubuntu:22.04
	Digest    string  `json:"digest"`    // manifest digest of the platform's image
	Platform  string  `json:"platform"`
	Layers    []Layer `json:"layers"` // base first
	Defaults  Defaults
	LayerDir  string `json:"layerDir"`
}

// Layer is one layer blob of an image.
type Layer struct {
	Digest    string `json:"digest"` // sha256:... of the blob as stored
	Size      int64  `json:"size"`
	MediaType string `json:"mediaType"`
}

// Defaults are the process settings the image's config asks for, used as
// a template's defaults.
type Defaults struct {
	Env        map[string]string `json:"env"`
	WorkingDir string            `json:"workingDir"`
	User       string            `json:"user"`
}
