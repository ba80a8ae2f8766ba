package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sync/errgroup"
)

// progressInterval limits how often download progress is reported.
const progressInterval = 100 * time.Millisecond

// Pull fetches the image ref for opts.Platform and stores its layers in
// opts.LayerDir, skipping layers already there. Short Docker Hub names work:
// "ubuntu:22.04" is index.docker.io/library/ubuntu:22.04.
func Pull(ctx context.Context, ref string, opts PullOptions) (*Image, error) {
	if opts.LayerDir == "" {
		return nil, errors.New("pull: no layer directory")
	}
	parsed, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("pull: %w %q: %w", ErrInvalidReference, ref, err)
	}
	platform, err := parsePlatform(opts.Platform)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	report := serialProgress(opts.Progress)
	report(Progress{Phase: PhaseResolving})

	remoteOpts := remoteOptions(ctx, opts)
	desc, err := remote.Get(parsed, remoteOpts...)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", parsed.Name(), classify(err))
	}
	img, err := selectImage(desc, platform)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", parsed.Name(), classify(err))
	}
	out, err := describe(img)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", parsed.Name(), classify(err))
	}
	out.Reference, out.Platform, out.LayerDir = parsed.Name(), platform.String(), opts.LayerDir

	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", parsed.Name(), classify(err))
	}
	if err := fetchLayers(ctx, layers, opts, report); err != nil {
		return nil, fmt.Errorf("pull %s: %w", parsed.Name(), err)
	}
	return out, nil
}

// Qualify returns ref fully qualified ("ubuntu:22.04" is
// "index.docker.io/library/ubuntu:22.04"), or an error wrapping
// ErrInvalidReference. Servers can call it to reject a request before
// starting a pull.
func Qualify(ref string) (string, error) {
	parsed, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("%w %q: %w", ErrInvalidReference, ref, err)
	}
	return parsed.Name(), nil
}

func parsePlatform(s string) (v1.Platform, error) {
	if s == "" {
		s = DefaultPlatform
	}
	p, err := v1.ParsePlatform(s)
	if err != nil || p.OS == "" || p.Architecture == "" {
		return v1.Platform{}, fmt.Errorf("%w: %q is not os/arch[/variant]", ErrNoPlatform, s)
	}
	return *p, nil
}

func remoteOptions(ctx context.Context, opts PullOptions) []remote.Option {
	keychain := opts.Keychain
	if keychain == nil {
		keychain = authn.DefaultKeychain
	}
	out := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(keychain)}
	transport := opts.Transport
	if transport == nil {
		transport = opts.Registries.transport()
	}
	out = append(out, remote.WithTransport(transport))
	return out
}

// selectImage picks the platform's image from an index, or checks that a
// single image is for the platform.
func selectImage(desc *remote.Descriptor, want v1.Platform) (v1.Image, error) {
	if !desc.MediaType.IsIndex() {
		img, err := desc.Image()
		if err != nil {
			return nil, err
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		have := v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}
		if cfg.Architecture != "" && !have.Satisfies(want) {
			return nil, fmt.Errorf("%w %s: the image is %s", ErrNoPlatform, want.String(), have.String())
		}
		return img, nil
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		return nil, err
	}
	manifest, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var available []string
	for _, m := range manifest.Manifests {
		if m.Platform == nil || !m.MediaType.IsImage() {
			continue
		}
		if m.Platform.Satisfies(want) {
			return idx.Image(m.Digest)
		}
		if m.Platform.OS != "unknown" { // attestation manifests
			available = append(available, m.Platform.String())
		}
	}
	return nil, fmt.Errorf("%w %s (available: %s)", ErrNoPlatform, want.String(), strings.Join(available, ", "))
}

// describe reads the digest, layer list and defaults of img.
func describe(img v1.Image) (*Image, error) {
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	out := &Image{Digest: digest.String(), Defaults: defaultsOf(cfg.Config)}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, err
		}
		size, err := l.Size()
		if err != nil {
			return nil, err
		}
		mt, err := l.MediaType()
		if err != nil {
			return nil, err
		}
		out.Layers = append(out.Layers, Layer{Digest: d.String(), Size: size, MediaType: string(mt)})
	}
	return out, nil
}

func defaultsOf(cfg v1.Config) Defaults {
	env := make(map[string]string, len(cfg.Env))
	for _, kv := range cfg.Env {
		k, v, _ := strings.Cut(kv, "=")
		if k != "" {
			env[k] = v
		}
	}
	return Defaults{Env: env, WorkingDir: cfg.WorkingDir, User: cfg.User}
}

// fetchLayers downloads the layers missing from the store, a few at once.
func fetchLayers(ctx context.Context, layers []v1.Layer, opts PullOptions, report func(Progress)) error {
	jobs := opts.Jobs
	if jobs <= 0 {
		jobs = 3
	}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(jobs)
	seen := map[string]bool{}
	for _, l := range layers {
		digest, err := l.Digest()
		if err != nil {
			return classify(err)
		}
		if seen[digest.String()] { // the same blob twice in one image
			continue
		}
		seen[digest.String()] = true
		g.Go(func() error { return fetchLayer(ctx, l, digest.String(), opts.LayerDir, report) })
	}
	return g.Wait()
}

func fetchLayer(ctx context.Context, l v1.Layer, digest, dir string, report func(Progress)) error {
	size, err := l.Size()
	if err != nil {
		return fmt.Errorf("layer %s: %w", digest, classify(err))
	}
	have, err := hasLayer(dir, digest)
	if err != nil {
		return err
	}
	if have {
		report(Progress{Phase: PhaseCached, Layer: digest, Current: size, Total: size})
		return nil
	}
	report(Progress{Phase: PhaseDownloading, Layer: digest, Total: size})
	rc, err := l.Compressed()
	if err != nil {
		return fmt.Errorf("layer %s: %w", digest, classify(err))
	}
	defer rc.Close()
	pr := &progressReader{ctx: ctx, r: rc, digest: digest, total: size, report: report}
	if err := putLayer(dir, digest, pr); err != nil {
		return classify(err)
	}
	report(Progress{Phase: PhaseDownloaded, Layer: digest, Current: size, Total: size})
	return nil
}

// progressReader reports bytes read, at most every progressInterval, and
// stops the copy when ctx ends.
type progressReader struct {
	ctx    context.Context
	r      io.Reader
	digest string
	total  int64
	n      int64
	last   time.Time
	report func(Progress)
}

func (p *progressReader) Read(b []byte) (int, error) {
	if err := p.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := p.r.Read(b)
	p.n += int64(n)
	if now := time.Now(); now.Sub(p.last) >= progressInterval {
		p.last = now
		p.report(Progress{Phase: PhaseDownloading, Layer: p.digest, Current: p.n, Total: p.total})
	}
	return n, err
}

// serialProgress wraps fn so that concurrent downloads call it one at a time.
func serialProgress(fn func(Progress)) func(Progress) {
	if fn == nil {
		return func(Progress) {}
	}
	var mu sync.Mutex
	return func(p Progress) {
		mu.Lock()
		defer mu.Unlock()
		fn(p)
	}
}

// classify wraps registry and network failures in this package's errors.
// A registry's reply is described by its status alone: the error goes back
// to the client, and the address may be a service other than a registry
// whose body must not be passed on.
func classify(err error) error {
	var terr *transport.Error
	if errors.As(err, &terr) {
		reply := fmt.Sprintf("registry replied %d %s", terr.StatusCode, http.StatusText(terr.StatusCode))
		switch {
		case terr.StatusCode == 401 || terr.StatusCode == 403:
			return fmt.Errorf("%w (or the repository does not exist): %s", ErrUnauthorized, reply)
		case terr.StatusCode == 404 || hasCode(terr, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode):
			return fmt.Errorf("%w: %s", ErrNotFound, reply)
		}
		return errors.New(reply)
	}
	var netErr net.Error
	var opErr *net.OpError
	var dnsErr *net.DNSError
	if errors.As(err, &opErr) || errors.As(err, &dnsErr) || errors.Is(err, ErrRefusedAddress) ||
		(errors.As(err, &netErr) && netErr.Timeout()) {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return err
}

func hasCode(terr *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range terr.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}
