package gateway

import (
	"context"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// Store is what a gateway uses of the cluster's database: a
// *postgres.Store, or a fake in tests.
type Store interface {
	auth.Store // teams and keys: the gateway serves their routes
	keyStore
	tokenStore
	nodeStore
	idempotencyDB
	SandboxNode(ctx context.Context, id string) (string, error)
	GetVolume(ctx context.Context, team, idOrName string) (*store.Volume, error)
	ListVolumes(ctx context.Context, team string) ([]*store.Volume, error)
	DeleteVolume(ctx context.Context, id string) ([]store.Ref, error)
	store.VolumeMover
	GetSandbox(ctx context.Context, id string) (*store.Sandbox, error)
	ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error)
	TemplateCopies(ctx context.Context, idOrName string) ([]*store.Template, error)
	// TemplateNamed finds any node's team template named name.
	TemplateNamed(ctx context.Context, name string) (*store.Template, error)
	ListTemplates(ctx context.Context) ([]*store.Template, error)
	ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]*store.Template, error)
	DeleteTemplate(ctx context.Context, id string) error
	BuildNode(ctx context.Context, name string) (string, error)
	MoveBuildNode(ctx context.Context, name, node string) error
	SetDraining(ctx context.Context, id string, draining bool) error
	RemoveNode(ctx context.Context, id string) error
}

// nodeStore is where the gateway reads the cluster's nodes.
type nodeStore interface {
	ListNodes(ctx context.Context) ([]postgres.Node, error)
}

// idempotencyDB keeps the answers of requests with an Idempotency-Key
// for every gateway (see postgres.ClaimIdempotency).
type idempotencyDB interface {
	ClaimIdempotency(ctx context.Context, key, bodySHA256 []byte, owner string, lease, ttl time.Duration) (
		claimed bool, prior string, row *postgres.IdempotencyRow, err error)
	RenewIdempotency(ctx context.Context, key []byte, owner string, lease time.Duration) (bool, error)
	NoteIdempotency(ctx context.Context, key []byte, owner, note string) (bool, error)
	FinishIdempotency(ctx context.Context, key []byte, owner string, status int,
		header map[string][]string, body []byte, ttl time.Duration) (bool, error)
	DropIdempotency(ctx context.Context, key []byte, owner string) (bool, error)
	ReleaseIdempotency(ctx context.Context, key []byte, owner string) (bool, error)
	DeleteExpiredIdempotency(ctx context.Context) (int64, error)
}

var _ Store = (*postgres.Store)(nil)
