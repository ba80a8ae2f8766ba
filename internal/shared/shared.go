// Package shared makes a node's templates and snapshots usable on every
// node of a cluster through S3-compatible object storage (package
// objectstore). It uploads a template's files after they are written
// locally, recording the upload's state on the template; it fetches
// another node's template when a sandbox is made from it: the checkpoint
// image into a bounded cache, the root filesystem once into a directory of
// fetched root filesystems; and it removes a deleted template's objects,
// with a garbage collector for what nothing refers to.
//
// Objects in the store:
//
//	templates/<template ID>  a snapshot's checkpoint image
//	rootfs/<rootfs ID>       a root filesystem (see template.RootfsID)
//	sandboxes/<sandbox ID>   the image of a sandbox paused to disk
//
// A snapshot is usable elsewhere once both its image and its root
// filesystem are uploaded; its record says "uploaded" only then. So is a
// sandbox paused to disk: when its node is gone, another node takes its
// record over (TakeOver) and resumes it from the store.
//
// Integrity: the record says "uploaded" together with the digests of what
// was uploaded (the image's and the root filesystem's), and every fetch
// is checked against those, never against the manifests in the bucket. A
// bucket writer can delete or damage objects (fetches then fail, with
// node.ErrBadGateway) but cannot change what a node restores.
package shared

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/aenv-dev/aenv/internal/auth"
	aenvnode "github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/objectstore"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// Records is what the package needs of the node's store.
type Records interface {
	ListTemplates(ctx context.Context) ([]*store.Template, error)
	SetTemplateUpload(ctx context.Context, id string, state store.UploadState, msg string, digests store.UploadDigests) error
	SetSandboxUpload(ctx context.Context, id string, state store.UploadState, digest string) error
}

// Config wires Images.
type Config struct {
	Store *objectstore.Store
	// Dir holds the image cache (cache/) and the root filesystems fetched
	// from the store (rootfs/).
	Dir        string
	CacheBytes int64
	// CacheMinFree is the free space the cache leaves on its file system
	// (objectstore.CacheOptions.MinFree).
	CacheMinFree int64
	// NodeID is this node's cluster ID ("" on a single server).
	NodeID  string
	Records Records
	// Find looks up an uploaded template of any node by ID or name
	// (ErrNotFound if none); nil on a single server, where every template
	// is the node's own.
	Find func(ctx context.Context, idOrName string) (*store.Template, error)
	// AllTemplates and AllSandboxes list every record that may refer to
	// objects (the whole cluster's); the garbage collector keeps what
	// they name.
	AllTemplates func(ctx context.Context) ([]*store.Template, error)
	AllSandboxes func(ctx context.Context) ([]*store.Sandbox, error)
	// Orphan returns another node's sandbox paused to disk whose image is
	// uploaded and whose node has been silent for SilentFor (ErrNotFound
	// otherwise); Claim makes it this node's, its image at imageDir, on
	// the same conditions. nil on a single server.
	Orphan    func(ctx context.Context, id string, silentFor time.Duration) (*store.Sandbox, error)
	Claim     func(ctx context.Context, id, imageDir string, silentFor time.Duration) (*store.Sandbox, error)
	SilentFor time.Duration
	// GCInterval is how often unreferenced objects are collected, GCGrace
	// how old an unreferenced object must be (longer than any upload);
	// 0 turns collection off.
	GCInterval, GCGrace time.Duration
	// Collects, when set, says whether this node is the one to collect
	// at a tick: one collector for a cluster rather than every node
	// reading every manifest. Nil: this node always collects.
	Collects func(ctx context.Context) (bool, error)
	Uploads  objectstore.UploaderOptions
	// Streamer, if set, resumes the fetches of images handed to their
	// restores before their memory file was complete that the previous
	// run left unfinished (objectstore.OpenCache); with LazyRestores, it
	// hands new fetches over so too.
	Streamer     objectstore.Streamer
	LazyRestores bool
	Logger       *slog.Logger
}

// Images is a node's view of the object store.
type Images struct {
	cfg      Config
	cache    *objectstore.Cache
	uploader *objectstore.Uploader

	mu   sync.Mutex
	jobs map[string]job // upload key → what to upload
	// forgotten: sandbox images dropped while their upload may run.
	forgotten map[string]bool
	// background counts deletes started by ForgetSandbox and Upload; Run waits.
	background sync.WaitGroup
	// rootfsLocks serialise the uploads of one rootfs; rootfsPut holds
	// the digest of each this process uploaded (trusted before any record
	// pins it).
	rootfsLocks map[string]*sync.Mutex
	rootfsPut   map[string]string
	// localIDs caches the rootfs ID of local root filesystems by path,
	// rootfsPaths the path of those found for an ID.
	localIDs    map[string]string
	rootfsPaths map[string]string
	fetches     singleflight.Group // root filesystem fetches, by rootfs ID
}

// job is one upload: a template's files, or a sandbox's image (sandboxID
// set) with the root filesystem it needs.
type job struct {
	templateID string
	sandboxID  string
	kind       store.TemplateKind
	rootfsPath string
	rootfsID   string
	// origin is the template the sandbox ran from: a checkpoint image
	// shares its pages (the chunked format's parents).
	origin string
	// replaces is the uploaded snapshot this one took the name of: the
	// first parent, its objects deleted when this upload ends.
	replaces *store.Template
	// rootfsDigest is set by Put once the root filesystem is in the
	// store: the digest recorded with the upload.
	rootfsDigest string
}

// Open prepares the cache directories; Run starts the uploads.
func Open(cfg Config) (*Images, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "rootfs"), 0o755); err != nil {
		return nil, fmt.Errorf("shared images: %w", err)
	}
	im := &Images{cfg: cfg, jobs: map[string]job{}, forgotten: map[string]bool{},
		rootfsLocks: map[string]*sync.Mutex{}, rootfsPut: map[string]string{}, localIDs: map[string]string{}, rootfsPaths: map[string]string{}}
	cache, err := objectstore.OpenCache(filepath.Join(cfg.Dir, "cache"), cfg.CacheBytes, cfg.Store,
		objectstore.CacheOptions{Streamer: cfg.Streamer, Lazy: cfg.LazyRestores, Logger: cfg.Logger,
			MinFree: cfg.CacheMinFree})
	if err != nil {
		return nil, fmt.Errorf("shared images: %w", err)
	}
	im.cache = cache
	opts := cfg.Uploads
	opts.OnState = im.recordUpload
	im.uploader = objectstore.NewUploader(im, opts)
	return im, nil
}

// NodeID is the node's cluster ID.
func (im *Images) NodeID() string { return im.cfg.NodeID }

// Remote reports whether tpl is another node's (found by Find).
func (im *Images) Remote(tpl *store.Template) bool {
	return tpl.NodeID != "" && tpl.NodeID != im.cfg.NodeID
}

// Run uploads what the records say is not uploaded yet (a previous run
// stopped first), then serves new uploads and collects garbage until ctx
// ends.
func (im *Images) Run(ctx context.Context) {
	defer im.cache.Close()
	defer im.background.Wait()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		im.uploader.Run(ctx)
	}()
	wg.Go(func() { im.reclaimLoop(ctx) })
	if templates, err := im.cfg.Records.ListTemplates(ctx); err != nil {
		im.cfg.Logger.WarnContext(ctx, "shared images: list templates to resume uploads", "err", err)
	} else {
		for _, t := range templates {
			// Uploaded before digests were recorded: uploaded again, so
			// that other nodes can verify what they fetch.
			unpinned := t.Upload == store.UploadUploaded && t.RootfsDigest == ""
			if t.Upload != store.UploadNone && t.Upload != store.UploadUploaded || unpinned {
				im.enqueue(t, "", nil)
			}
		}
	}
	if im.cfg.GCInterval > 0 && im.cfg.AllTemplates != nil && im.cfg.AllSandboxes != nil {
		every(ctx, im.cfg.GCInterval, func() { im.collectIfMine(ctx) })
	}
	<-ctx.Done()
}

// collectIfMine collects garbage, unless another node of the cluster is the
// one to.
func (im *Images) collectIfMine(ctx context.Context) {
	if im.cfg.Collects != nil {
		if mine, err := im.cfg.Collects(ctx); err != nil || !mine {
			if err != nil && ctx.Err() == nil {
				im.cfg.Logger.WarnContext(ctx, "shared images: who collects garbage", "err", err)
			}
			return
		}
	}
	if st, err := im.CollectGarbage(ctx); err != nil {
		im.cfg.Logger.WarnContext(ctx, "shared images: garbage collection", "err", err)
	} else if st.Objects > 0 || st.Uploads > 0 || st.Packs > 0 {
		im.cfg.Logger.InfoContext(ctx, "shared images: garbage collected", "images", st.Images,
			"objects", st.Objects, "packs", st.Packs, "uploads", st.Uploads)
	}
}

// every calls f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			f()
		}
	}
}

// reclaimEvery is how often the caches look at the free space of their
// disk without a fetch, an upload or a release to make them.
const reclaimEvery = 30 * time.Second

// reclaimLoop has the caches give way to a disk filling from elsewhere (the
// node's sandboxes, its templates) while the node fetches nothing: each
// tick costs a statfs per cache while the disk has room.
func (im *Images) reclaimLoop(ctx context.Context) {
	every(ctx, reclaimEvery, func() {
		im.cache.Reclaim()
		im.cfg.Store.ReclaimChunks()
	})
}

// Share marks tpl, about to be recorded, for upload: it names its root
// filesystem and sets its state pending. Recording it makes its objects
// live for the garbage collector before any is written.
func (im *Images) Share(tpl *store.Template) error {
	if tpl.RootfsID == "" {
		id, err := im.rootfsID(tpl.RootfsPath)
		if err != nil {
			return err
		}
		tpl.RootfsID = id
	}
	tpl.Upload, tpl.UploadError = store.UploadPending, ""
	return nil
}

// Upload queues the upload of tpl's files (recorded by then, with Share).
// origin is the template the snapshot's sandbox ran from ("" if tpl is not
// a snapshot): its image shares pages with tpl's. replaces is the snapshot
// whose name tpl took (its record gone), nil if none: its objects, if it
// was uploaded, are tpl's first parent and are deleted once tpl's upload
// has ended (a node that stops first leaves them to the collector).
func (im *Images) Upload(tpl *store.Template, origin string, replaces *store.Template) {
	if replaces != nil && (replaces.Upload != store.UploadUploaded || replaces.ImageDigest == "") {
		old := replaces // nothing to share: deleted now
		replaces = nil
		im.inBackground(func(ctx context.Context) { im.Delete(ctx, old) })
	}
	im.enqueue(tpl, origin, replaces)
}

// inBackground runs a delete the caller must not wait for (it holds the
// sandbox, and the store may be slow or away; the collector removes what
// it misses), bounded by a minute. Run waits for it.
func (im *Images) inBackground(del func(ctx context.Context)) {
	im.background.Add(1)
	go func() {
		defer im.background.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		del(ctx)
	}()
}

func (im *Images) enqueue(tpl *store.Template, origin string, replaces *store.Template) {
	key := imageKey(tpl.ID)
	dir := tpl.ImageDir
	if dir == "" {
		dir = tpl.RootfsPath
	}
	im.mu.Lock()
	if old, ok := im.jobs[key]; ok && old.replaces != nil && replaces == nil {
		replaces = old.replaces // queued again: the first job's duty holds
	}
	im.jobs[key] = job{templateID: tpl.ID, kind: tpl.Kind, rootfsPath: tpl.RootfsPath, rootfsID: tpl.RootfsID,
		origin: origin, replaces: replaces}
	im.mu.Unlock()
	if err := im.uploader.Enqueue(key, dir); err != nil {
		im.cfg.Logger.Warn("shared images: queue upload", "template", tpl.ID, "err", err)
	}
}

// UploadSandbox queues the upload of the image of sb, paused to disk and
// recorded, and of the root filesystem it runs over (rootfsPath, named
// rootfsID).
func (im *Images) UploadSandbox(sb *store.Sandbox, rootfsPath, rootfsID string) {
	key := sandboxKey(sb.ID)
	im.mu.Lock()
	im.jobs[key] = job{sandboxID: sb.ID, rootfsPath: rootfsPath, rootfsID: rootfsID, origin: sb.TemplateID}
	im.mu.Unlock()
	if err := im.uploader.Enqueue(key, sb.ImageDir); err != nil {
		im.cfg.Logger.Warn("shared images: queue upload", "sandbox", sb.ID, "err", err)
	}
}

// ForgetSandbox drops the stored image of sandbox id (resumed or killed
// here): an upload not begun is skipped, one running is deleted when done.
func (im *Images) ForgetSandbox(id string) {
	key := sandboxKey(id)
	im.mu.Lock()
	if _, queued := im.jobs[key]; queued {
		delete(im.jobs, key)
		im.forgotten[key] = true
	}
	im.mu.Unlock()
	im.inBackground(func(ctx context.Context) {
		if err := im.cfg.Store.Delete(ctx, key); err != nil {
			im.cfg.Logger.Warn("shared images: delete a sandbox's image (the collector retries)", "sandbox", id, "err", err)
		}
	})
}

// Put uploads one job: the root filesystem unless the store has it, then
// the checkpoint image. The uploader calls it and retries it. A job
// forgotten meanwhile (its sandbox resumed) is done: nothing to upload.
func (im *Images) Put(ctx context.Context, key, dir string) (objectstore.Manifest, error) {
	im.mu.Lock()
	j, ok := im.jobs[key]
	im.mu.Unlock()
	if !ok {
		return objectstore.Manifest{}, nil
	}
	m, err := im.putRootfs(ctx, j.rootfsID, j.rootfsPath)
	if err != nil {
		return objectstore.Manifest{}, err
	}
	im.mu.Lock()
	if cur, ok := im.jobs[key]; ok {
		cur.rootfsDigest = m.Digest
		im.jobs[key] = cur
	}
	im.mu.Unlock()
	if j.sandboxID == "" && (j.kind == store.KindRootfs || j.kind == "") {
		return m, nil // a rootfs template is its root filesystem
	}
	return im.cfg.Store.PutImage(ctx, key, dir, im.parents(ctx, j))
}

// parents are the uploaded images a checkpoint image of j likely shares
// most pages with: the snapshot it replaced by name, the newest other
// snapshot of the same sandbox (the previous step of a trajectory), then
// the template the sandbox ran from (or, not known, a guess at it).
// Records that cannot be read leave the image whole, not failed.
func (im *Images) parents(ctx context.Context, j job) []objectstore.Parent {
	list := im.cfg.Records.ListTemplates
	if im.cfg.AllTemplates != nil {
		list = im.cfg.AllTemplates
	}
	templates, err := list(ctx)
	if err != nil {
		im.cfg.Logger.WarnContext(ctx, "shared images: list templates for an image's parents", "err", err)
		return nil
	}
	source := j.sandboxID
	var self *store.Template
	for _, t := range templates {
		if t.ID == j.templateID {
			self, source = t, t.SourceSandbox
		}
	}
	uploaded := func(t *store.Template) bool {
		return t.Upload == store.UploadUploaded && t.ImageDigest != "" && t.ID != j.templateID
	}
	var previous, origin *store.Template
	for _, t := range templates {
		if !uploaded(t) {
			continue
		}
		if source != "" && t.SourceSandbox == source && (previous == nil || t.CreatedAt.After(previous.CreatedAt)) {
			previous = t
		}
		if j.origin != "" && t.ID == j.origin {
			origin = t
		}
	}
	if j.origin == "" && self != nil && self.RootfsID != "" {
		// Queued again at a start, the origin unrecorded: the newest
		// older checkpoint over the same root filesystem (a sandbox's
		// template when it has an image) is the likeliest. Only a guess
		// at sharing: any parent gives a whole image.
		for _, t := range templates {
			sameTeam := t.TeamID == "" || t.TeamID == self.TeamID // its ID shows as the parent
			if uploaded(t) && sameTeam && t.RootfsID == self.RootfsID && t.SourceSandbox != source &&
				t.CreatedAt.Before(self.CreatedAt) && (origin == nil || t.CreatedAt.After(origin.CreatedAt)) {
				origin = t
			}
		}
	}
	var out []objectstore.Parent
	if j.replaces != nil {
		// The step before this one, whose record this one took over.
		out = append(out, objectstore.Parent{Key: imageKey(j.replaces.ID), Digest: j.replaces.ImageDigest})
	}
	for _, t := range []*store.Template{previous, origin} {
		if t != nil && !slices.ContainsFunc(out, func(p objectstore.Parent) bool { return p.Key == imageKey(t.ID) }) {
			out = append(out, objectstore.Parent{Key: imageKey(t.ID), Digest: t.ImageDigest})
		}
	}
	return out
}

// putRootfs makes sure the store has the root filesystem id, and returns
// the manifest whose digest the caller records. One already in the store is
// taken only when a record pins its manifest's digest for id (an upload of
// ours): the bucket's word alone would let its writer choose the digest.
func (im *Images) putRootfs(ctx context.Context, id, path string) (objectstore.Manifest, error) {
	lock := im.rootfsLock(id)
	lock.Lock()
	defer lock.Unlock()
	key := rootfsKey(id)
	m, err := im.cfg.Store.Stat(ctx, key)
	if err != nil && !errors.Is(err, objectstore.ErrNotFound) {
		return m, fmt.Errorf("rootfs %s: %w", id, err)
	}
	im.mu.Lock()
	ours := im.rootfsPut[id]
	im.mu.Unlock()
	if err == nil && ours != "" && m.Digest == ours {
		return m, nil
	}
	if err == nil {
		pinned, err := im.rootfsPinned(ctx, id, m.Digest)
		if err != nil {
			return objectstore.Manifest{}, fmt.Errorf("rootfs %s: %w", id, err)
		}
		if pinned {
			return m, nil
		}
	}
	start := time.Now()
	m, err = im.cfg.Store.Put(ctx, key, path)
	if err != nil {
		return m, fmt.Errorf("upload rootfs %s: %w", id, err)
	}
	im.mu.Lock()
	im.rootfsPut[id] = m.Digest
	im.mu.Unlock()
	im.cfg.Logger.InfoContext(ctx, "shared images: root filesystem uploaded", "rootfs", id,
		"bytes", m.Size, "took", time.Since(start).Round(time.Millisecond))
	return m, nil
}

// rootfsPinned reports whether a template record (any node's) pins digest
// for the root filesystem id.
func (im *Images) rootfsPinned(ctx context.Context, id, digest string) (bool, error) {
	list := im.cfg.Records.ListTemplates
	if im.cfg.AllTemplates != nil {
		list = im.cfg.AllTemplates
	}
	templates, err := list(ctx)
	if err != nil {
		return false, err
	}
	for _, t := range templates {
		if t.RootfsID == id && t.RootfsDigest != "" && t.RootfsDigest == digest {
			return true, nil
		}
	}
	return false, nil
}

// recordUpload writes an upload's state on its template's record. A
// template deleted meanwhile leaves objects nothing refers to: they are
// removed at once.
func (im *Images) recordUpload(st objectstore.UploadStatus) {
	im.mu.Lock()
	j, ok := im.jobs[st.Key]
	ended := st.State == objectstore.UploadUploaded || st.State == objectstore.UploadFailed && st.Retry.IsZero()
	if ok && ended {
		delete(im.jobs, st.Key)
	}
	forgotten := im.forgotten[st.Key]
	if forgotten && st.State == objectstore.UploadUploaded {
		delete(im.forgotten, st.Key)
	}
	im.mu.Unlock()
	if !ok {
		if forgotten && st.State == objectstore.UploadUploaded {
			// Forgotten while it ran: what it wrote is nobody's.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := im.cfg.Store.Delete(ctx, st.Key); err != nil {
				im.cfg.Logger.Warn("shared images: remove a forgotten image", "key", st.Key, "err", err)
			}
		}
		return
	}
	msg := ""
	if st.Err != nil {
		msg = st.Err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if j.sandboxID != "" {
		im.recordSandboxUpload(ctx, j, st)
		return
	}
	if ended && j.replaces != nil {
		// Shared from (or given up on): the replaced snapshot's objects
		// go, after this one's record says where it stands.
		defer im.Delete(ctx, j.replaces)
	}
	var digests store.UploadDigests
	if st.State == objectstore.UploadUploaded {
		digests.Rootfs = j.rootfsDigest
		if j.kind != store.KindRootfs && j.kind != "" {
			digests.Image = st.Manifest.Digest
			digests.Stats = store.ImageStats{Bytes: st.Manifest.Bytes, NewBytes: st.Manifest.NewBytes,
				Parent: strings.TrimPrefix(st.Manifest.Parent, imageKey(""))}
		}
	}
	err := im.cfg.Records.SetTemplateUpload(ctx, j.templateID, store.UploadState(st.State), msg, digests)
	switch {
	case errors.Is(err, store.ErrNotFound) && st.State == objectstore.UploadUploaded:
		if err := im.cfg.Store.Delete(ctx, st.Key); err != nil {
			im.cfg.Logger.Warn("shared images: remove objects of a deleted template", "key", st.Key, "err", err)
		}
	case err != nil && !errors.Is(err, store.ErrNotFound):
		im.cfg.Logger.Warn("shared images: record upload state", "template", j.templateID, "state", st.State, "err", err)
	}
	if st.State == objectstore.UploadUploaded {
		im.cfg.Logger.Info("shared images: template uploaded", "template", j.templateID, "attempt", st.Attempt)
	} else if st.State == objectstore.UploadFailed {
		im.cfg.Logger.Warn("shared images: upload failed", "template", j.templateID, "attempt", st.Attempt,
			"retry", st.Retry, "err", st.Err)
	}
}

// recordSandboxUpload is recordUpload for a sandbox's image. One whose
// record holds no image any more (resumed meanwhile) has it deleted.
func (im *Images) recordSandboxUpload(ctx context.Context, j job, st objectstore.UploadStatus) {
	digest := ""
	if st.State == objectstore.UploadUploaded {
		digest = st.Manifest.Digest
	}
	err := im.cfg.Records.SetSandboxUpload(ctx, j.sandboxID, store.UploadState(st.State), digest)
	if st.State != objectstore.UploadUploaded {
		if st.Err != nil {
			im.cfg.Logger.Warn("shared images: upload of a sandbox's image failed", "sandbox", j.sandboxID,
				"attempt", st.Attempt, "retry", st.Retry, "err", st.Err)
		}
		return
	}
	if errors.Is(err, store.ErrNotFound) {
		if err := im.cfg.Store.Delete(ctx, st.Key); err != nil {
			im.cfg.Logger.Warn("shared images: remove the image of a resumed sandbox", "key", st.Key, "err", err)
		}
		return
	}
	if err != nil {
		im.cfg.Logger.Warn("shared images: record upload state", "sandbox", j.sandboxID, "err", err)
		return
	}
	im.cfg.Logger.Info("shared images: sandbox image uploaded", "sandbox", j.sandboxID, "attempt", st.Attempt)
}

// TakeOver makes another node's sandbox paused to disk this node's: when
// that node has been silent long enough and the image is uploaded, the
// image is fetched into dir (which must not exist) and the record claimed.
// ErrNotFound if there is no such sandbox; the record is unchanged when
// anything fails.
func (im *Images) TakeOver(ctx context.Context, id, dir string) (*store.Sandbox, error) {
	if im.cfg.Orphan == nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, store.ErrNotFound)
	}
	sb, err := im.cfg.Orphan(ctx, id, im.cfg.SilentFor)
	if err != nil {
		return nil, err
	}
	if p, ok := auth.FromContext(ctx); ok && !p.Sees(sb.TeamID) {
		// Another team's sandbox is, to this caller, one that does not
		// exist: its node being gone changes nothing.
		return nil, fmt.Errorf("sandbox %s: %w", id, store.ErrNotFound)
	}
	start := time.Now()
	if _, err := im.cfg.Store.Get(ctx, sandboxKey(id), sb.ImageDigest, dir); err != nil {
		return nil, fmt.Errorf("fetch the image of sandbox %s: %w", id, fetchError(err))
	}
	claimed, err := im.cfg.Claim(ctx, id, dir, im.cfg.SilentFor)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("take over sandbox %s: %w", id, err)
	}
	im.cfg.Logger.InfoContext(ctx, "shared images: took over a sandbox paused to disk", "sandbox", id,
		"from", sb.NodeID, "took", time.Since(start).Round(time.Millisecond))
	return claimed, nil
}

// Find returns another node's uploaded template, its root filesystem
// fetched to this node (once) and RootfsPath pointing at it; ErrNotFound
// if no node has one by that ID or name. Its ImageDir is the other node's:
// restore from Image.
func (im *Images) Find(ctx context.Context, idOrName string) (*store.Template, error) {
	if im.cfg.Find == nil {
		return nil, fmt.Errorf("template %s: %w", idOrName, store.ErrNotFound)
	}
	tpl, err := im.cfg.Find(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	if tpl.RootfsDigest == "" {
		// Uploaded before digests were recorded: not usable here until
		// its node uploads it again (at its next start).
		return nil, fmt.Errorf("template %s: uploaded without a recorded digest: %w", idOrName, store.ErrNotFound)
	}
	path, err := im.Rootfs(ctx, tpl.RootfsID, tpl.RootfsDigest)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", tpl.Name, err)
	}
	tpl.RootfsPath = path
	return tpl, nil
}

// Rootfs returns the local path of the root filesystem id: one of the
// node's own templates', one fetched before, or fetched now and checked
// against digest (recorded at its upload).
func (im *Images) Rootfs(ctx context.Context, id, digest string) (string, error) {
	if id == "" {
		return "", errors.New("no root filesystem identity recorded")
	}
	// The fetch is not the caller's: a create that gives up (its client's
	// deadline) leaves it running for the next one, and concurrent callers
	// share it.
	ch := im.fetches.DoChan(id, func() (any, error) {
		fctx, cancel := context.WithTimeout(context.Background(), rootfsFetchTimeout)
		defer cancel()
		return im.rootfs(fctx, id, digest)
	})
	select {
	case <-ctx.Done():
		return "", fmt.Errorf("fetch rootfs %s: %w", id, ctx.Err())
	case res := <-ch:
		if res.Err != nil {
			return "", res.Err
		}
		return res.Val.(string), nil
	}
}

// rootfsFetchTimeout bounds one fetch of a root filesystem.
const rootfsFetchTimeout = 30 * time.Minute

// rootfs is Rootfs's work, one at a time per ID (the singleflight).
func (im *Images) rootfs(ctx context.Context, id, digest string) (string, error) {
	fetched := filepath.Join(im.cfg.Dir, "rootfs", id, "rootfs")
	if _, err := os.Stat(fetched); err == nil {
		return fetched, nil
	}
	im.mu.Lock()
	known, ok := im.rootfsPaths[id]
	im.mu.Unlock()
	if _, err := os.Stat(known); ok && err == nil {
		return known, nil
	}
	if path, err := im.localRootfs(ctx, id); err != nil || path != "" {
		if path != "" {
			// Remembered: a create from another node's snapshot then
			// reads no template list.
			im.mu.Lock()
			im.rootfsPaths[id] = path
			im.mu.Unlock()
		}
		return path, err
	}
	if err := os.MkdirAll(filepath.Dir(fetched), 0o755); err != nil {
		return "", fmt.Errorf("fetch rootfs %s: %w", id, err)
	}
	start := time.Now()
	// Get unpacks beside fetched and renames it into place only whole and
	// verified, so a rootfs directory that exists is complete.
	m, err := im.cfg.Store.Get(ctx, rootfsKey(id), digest, fetched)
	if err != nil {
		return "", fmt.Errorf("fetch rootfs %s: %w", id, fetchError(err))
	}
	if err := template.SetRootfsID(fetched, id); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	im.cfg.Logger.InfoContext(ctx, "shared images: root filesystem fetched", "rootfs", id,
		"bytes", m.Bytes, "took", time.Since(start).Round(time.Millisecond))
	return fetched, nil
}

// localRootfs finds a template of this node whose root filesystem is id.
func (im *Images) localRootfs(ctx context.Context, id string) (string, error) {
	templates, err := im.cfg.Records.ListTemplates(ctx)
	if err != nil {
		return "", fmt.Errorf("rootfs %s: %w", id, err)
	}
	for _, t := range templates {
		if t.RootfsPath == "" {
			continue
		}
		if have, err := im.rootfsID(t.RootfsPath); err == nil && have == id {
			if _, err := os.Stat(t.RootfsPath); err == nil {
				return t.RootfsPath, nil
			}
		}
	}
	return "", nil
}

func (im *Images) rootfsID(path string) (string, error) {
	im.mu.Lock()
	id, ok := im.localIDs[path]
	im.mu.Unlock()
	if ok {
		return id, nil
	}
	id, err := template.RootfsID(path)
	if err != nil {
		return "", err
	}
	im.mu.Lock()
	im.localIDs[path] = id
	im.mu.Unlock()
	return id, nil
}

func (im *Images) rootfsLock(id string) *sync.Mutex {
	im.mu.Lock()
	defer im.mu.Unlock()
	l, ok := im.rootfsLocks[id]
	if !ok {
		l = &sync.Mutex{}
		im.rootfsLocks[id] = l
	}
	return l
}

// Image returns a local copy of tpl's checkpoint image (another node's
// template), downloading it into the cache first if needed; release it
// once the restore has read it.
func (im *Images) Image(ctx context.Context, tpl *store.Template) (dir string, release func(), err error) {
	start := time.Now()
	h, err := im.cache.Acquire(ctx, imageKey(tpl.ID), tpl.ImageDigest)
	if err != nil {
		return "", nil, fmt.Errorf("fetch image of %s: %w", tpl.Name, fetchError(err))
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		// With a Streamer, the memory file may still be arriving.
		im.cfg.Logger.InfoContext(ctx, "shared images: image ready to restore from", "template", tpl.ID,
			"took", took.Round(time.Millisecond))
	}
	return h.Path(), h.Release, nil
}

// Delete removes a deleted template's image from the store (its root
// filesystem may serve others; the collector removes it when none is
// left) and from the cache.
func (im *Images) Delete(ctx context.Context, tpl *store.Template) {
	if tpl.Upload == store.UploadNone {
		return
	}
	key := imageKey(tpl.ID)
	if err := im.cfg.Store.Delete(ctx, key); err != nil {
		im.cfg.Logger.WarnContext(ctx, "shared images: delete objects (the collector retries)", "key", key, "err", err)
	}
	if err := im.cache.Purge(key); err != nil {
		im.cfg.Logger.WarnContext(ctx, "shared images: purge cache", "key", key, "err", err)
	}
}

// CollectGarbage removes the objects no template record refers to and
// older than the grace period.
func (im *Images) CollectGarbage(ctx context.Context) (objectstore.GCStats, error) {
	templates, err := im.cfg.AllTemplates(ctx)
	if err != nil {
		return objectstore.GCStats{}, fmt.Errorf("list templates: %w", err)
	}
	sandboxes, err := im.cfg.AllSandboxes(ctx)
	if err != nil {
		return objectstore.GCStats{}, fmt.Errorf("list sandboxes: %w", err)
	}
	return im.cfg.Store.GC(ctx, LiveKeys(templates, sandboxes), im.cfg.GCGrace)
}

// LiveKeys says which object keys the records refer to.
func LiveKeys(templates []*store.Template, sandboxes []*store.Sandbox) func(key string) bool {
	live := map[string]bool{}
	for _, sb := range sandboxes {
		if sb.ImageUpload != store.UploadNone && sb.ImageDir != "" {
			live[sandboxKey(sb.ID)] = true
		}
	}
	for _, t := range templates {
		if t.Upload == store.UploadNone {
			continue
		}
		live[imageKey(t.ID)] = true
		if t.RootfsID != "" {
			live[rootfsKey(t.RootfsID)] = true
		}
	}
	return func(key string) bool { return live[key] }
}

// fetchError classifies a failed fetch of an object a record says is
// uploaded: missing, or not matching the digest recorded at its upload,
// the object store failed us (502), not the client or this node.
func fetchError(err error) error {
	if errors.Is(err, objectstore.ErrCorrupt) || errors.Is(err, objectstore.ErrNotFound) {
		return fmt.Errorf("%w: %w", aenvnode.ErrBadGateway, err)
	}
	return err
}

func imageKey(templateID string) string { return "templates/" + templateID }
func rootfsKey(id string) string        { return "rootfs/" + id }
func sandboxKey(id string) string       { return "sandboxes/" + id }
