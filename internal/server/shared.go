package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/config"
	"github.com/aenv-dev/aenv/internal/objectstore"
	"github.com/aenv-dev/aenv/internal/runtime/gvisor/ckptgofer"
	"github.com/aenv-dev/aenv/internal/shared"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// collector is the node of a cluster that collects the object store's
// garbage: the first by ID of the live nodes that share images and speak
// the newest protocol among them (an older release may not know every
// object a newer one writes, so in a roll it steps down). self when there
// is none such (this node has just joined). Nodes that briefly disagree
// collect twice, which is safe, only wasted. Every node is to run with the
// same --object-store-gc-secs: the elected one's is the cluster's.
func collector(nodes []postgres.Node, silentFor time.Duration, self string) string {
	able := func(n postgres.Node) bool { return n.SharedImages && n.HeartbeatAge < silentFor }
	newest := cluster.Protocol
	for _, n := range nodes {
		if able(n) && n.Protocol > newest {
			newest = n.Protocol
		}
	}
	for _, n := range nodes { // by ID
		if able(n) && n.Protocol == newest {
			return n.ID
		}
	}
	if newest > cluster.Protocol {
		return "" // a newer release collects (once its node is live)
	}
	return self
}

// sharedImages is the node's object store while the server runs.
type sharedImages struct {
	images *shared.Images
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// openShared connects to --object-store (nil without one) and starts its
// uploads. In a cluster (member set) templates of other nodes are found
// through the database.
func openShared(ctx context.Context, cfg config.Server, st store.Store, member *clusterMember,
	logger *slog.Logger) (*sharedImages, error) {
	if cfg.ObjectStore == "" {
		return nil, nil
	}
	storeCfg, err := objectstore.ConfigFromEnv(cfg.ObjectStore, func(name string) string {
		switch {
		case name == "AWS_ENDPOINT_URL_S3" && cfg.ObjectStoreEndpoint != "":
			return cfg.ObjectStoreEndpoint
		case name == "AWS_REGION" && cfg.ObjectStoreRegion != "":
			return cfg.ObjectStoreRegion
		}
		return os.Getenv(name)
	})
	if err != nil {
		return nil, fmt.Errorf("--object-store: %w", err)
	}
	openCtx, cancelOpen := context.WithTimeout(ctx, time.Minute)
	defer cancelOpen()
	// Packs of chunked images this node wrote or fetched stay on disk
	// within the same budget as the images: a fetch then downloads only
	// the pages it lacks.
	storeCfg.ChunkDir = filepath.Join(cfg.DataDir, "shared", "chunks")
	storeCfg.ChunkBytes = int64(cfg.ImageCacheMB) << 20
	// Both caches give way to a disk running full: the node's own
	// templates, snapshots and sandboxes need it more.
	storeCfg.ChunkMinFree = int64(cfg.ImageCacheMinFreeMB) << 20
	storeCfg.StallTimeout = config.Seconds(cfg.ObjectStoreStallSecs)
	objects, err := objectstore.Open(openCtx, storeCfg)
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", cfg.ObjectStore, err)
	}
	scfg := shared.Config{
		Store: objects, Dir: filepath.Join(cfg.DataDir, "shared"), CacheBytes: int64(cfg.ImageCacheMB) << 20,
		CacheMinFree: int64(cfg.ImageCacheMinFreeMB) << 20,
		Records:      st, AllTemplates: st.ListTemplates,
		AllSandboxes: func(ctx context.Context) ([]*store.Sandbox, error) {
			return st.ListSandboxes(ctx, store.SandboxFilter{})
		},
		GCInterval: config.Seconds(cfg.ObjectStoreGCSecs), GCGrace: config.Seconds(cfg.ObjectStoreGCSecs),
		Logger: logger,
	}
	// Whether this node restores lazily or not, its previous run may have:
	// the sandboxes it adopts may wait for a fetch to resume.
	scfg.Streamer = feedStreamer{logger: logger}
	scfg.LazyRestores = lazyRestores(cfg)
	if member != nil {
		scfg.NodeID = member.id
		scfg.Find = member.db.SharedTemplate
		scfg.AllTemplates = member.db.AllTemplates
		scfg.AllSandboxes = member.db.AllSandboxes
		scfg.Orphan, scfg.Claim = member.db.OrphanSandbox, member.db.ClaimSandbox
		// A node silent for five heartbeats is gone for the purpose of
		// taking its sandboxes paused to disk over.
		scfg.SilentFor = 5 * time.Duration(member.cfg.HeartbeatIntervalMS) * time.Millisecond
		scfg.Collects = func(ctx context.Context) (bool, error) {
			nodes, err := member.db.ListNodes(ctx)
			if err != nil {
				return false, err
			}
			return collector(nodes, scfg.SilentFor, member.id) == member.id, nil
		}
	}
	images, err := shared.Open(scfg)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &sharedImages{images: images, cancel: cancel}
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		images.Run(runCtx)
	}()
	logger.InfoContext(ctx, "object store ready", "url", cfg.ObjectStore, "endpoint", storeCfg.Endpoint,
		"cache_mb", cfg.ImageCacheMB)
	return s, nil
}

// close stops the uploads; those not done resume at the next start.
func (s *sharedImages) close() {
	if s == nil {
		return
	}
	s.cancel()
	s.done.Wait()
}

// lazyRestores says whether restores of fetched images start before their
// memory has arrived: the driver's checkpoint gofer and the cache's
// streamer go together.
func lazyRestores(cfg config.Server) bool {
	return cfg.LazyRestore && cfg.ObjectStore != ""
}

// feedStreamer hands a fetched checkpoint image to restores before its
// memory file is written: runsc reads it through aenv's checkpoint gofer,
// whose reads wait on a feed the fetch tells of each range written.
type feedStreamer struct {
	logger *slog.Logger
}

func (feedStreamer) File() string { return ckptgofer.PagesFile }

func (fs feedStreamer) Start(dir string, size int64, prioritize func(off, n int64), resumed string) (objectstore.Stream, error) {
	socket := resumedFeed(resumed)
	if socket != "" {
		// The gofers of the sandboxes restored from it by the previous
		// run dial this socket again until a feed answers.
		fs.logger.Info("shared images: resuming the memory file of an image sandboxes were restored from", "dir", dir)
	} else {
		var b [12]byte
		rand.Read(b[:])
		// An abstract socket: no path to outgrow sun_path or to leave
		// behind.
		socket = feedPrefix + hex.EncodeToString(b[:])
	}
	feed, err := ckptgofer.NewFeed(socket, size, prioritize)
	if err != nil {
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		feed.Close()
		return nil, err
	}
	if err := ckptgofer.WriteOptions(dir, socket); err != nil {
		feed.Close()
		return nil, err
	}
	return &feedStream{dir: dir, feed: feed, size: size, started: time.Now(), logger: fs.logger}, nil
}

// feedPrefix starts the name of every feed's (abstract) socket.
const feedPrefix = "@aenv-feed-"

// resumedFeed is the feed socket the options file in the image directory
// dir names ("" if none): where a previous run's gofers wait.
func resumedFeed(dir string) string {
	if dir == "" {
		return ""
	}
	opts, err := ckptgofer.ReadOptions(dir)
	if err != nil || !strings.HasPrefix(opts.Feed, feedPrefix) {
		return ""
	}
	return opts.Feed
}

type feedStream struct {
	dir     string
	feed    *ckptgofer.Feed
	size    int64
	started time.Time
	logger  *slog.Logger
}

func (s *feedStream) Written(off, n int64) { s.feed.Ready(off, n) }

// Finish: once complete, restores that start read the image as any other
// (the options file goes, durably, before the cache records the entry); a
// restore that read the options before keeps the feed, which answers at
// once. On failure the sandboxes reading wait no more: their reads fail.
func (s *feedStream) Finish(err error) error {
	if err != nil && s.feed.Complete() {
		// All of it is there already (the error came after): the
		// sandboxes reading it may go on.
		return nil
	}
	if err != nil {
		s.logger.Warn("shared images: the memory file of an image being restored from will not arrive; its sandboxes end",
			"dir", s.dir, "err", err)
		s.feed.Fail(err)
		return nil
	}
	if err := os.Remove(filepath.Join(s.dir, ckptgofer.OptionsFile)); err != nil {
		return err
	}
	d, err := os.Open(s.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return err
	}
	// Said once restores starting now read the image directly.
	s.logger.Info("shared images: memory file arrived", "dir", s.dir, "bytes", s.size,
		"took", time.Since(s.started).Round(time.Millisecond))
	return nil
}

func (s *feedStream) Close() { s.feed.Close() }
