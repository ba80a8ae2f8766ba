// Package secret keeps users' secrets (E2B's Secret API): values the
// egress gateway sets into requests on their way out (network.rules'
// header transforms), which nothing inside a sandbox ever reads.
//
// Values are write-only: no API returns one, and none is logged. They are
// sealed (AES-256-GCM, seal.go) before they reach a store, under a key the
// operator gives (--secrets-key-file; a single server makes its own in
// its data directory), and opened only to be put into a request. Each
// update is a new version; readers get the current one.
package secret

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
	"golang.org/x/net/http/httpguts"
)

// NoClusterKey is why a cluster member without --secrets-key-file refuses
// secrets.
const NoClusterKey = "the cluster has no --secrets-key-file: give every node and gateway the same one"

// IDPrefix starts every secret's ID; names may not start with it.
const IDPrefix = "sec_"

// Limits of what a secret holds (E2B's documented metadata bounds).
const (
	MaxNameLen           = 128
	MaxValueBytes        = 64 << 10
	MaxMetadataEntries   = 32
	MaxMetadataKeyBytes  = 128
	MaxMetadataValBytes  = 1024
	MaxMetadataBytes     = 8192
	DefaultMaxTeamSecret = 1000
)

// cacheTTL is how long a value opened for the gateway is used before it
// is read again: an update reaches requests within it.
const cacheTTL = 2 * time.Second

// validName is a secret's name once lower-cased: what is safe inside a
// ${e2b.secrets.<name>} placeholder, a header and a log line.
var validName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// Placeholder is how a transform names a secret's value:
// ${e2b.secrets.<name>} (E2B's Secret.fill).
var Placeholder = regexp.MustCompile(`\$\{e2b\.secrets\.([^{}]*)\}`)

// Service keeps a node's (or a cluster's) secrets.
type Service struct {
	records    store.SecretStore
	box        *Box // nil: no key, and secrets are refused
	noKeyWhy   string
	maxPerTeam int

	mu    sync.Mutex
	cache map[string]cachedValue // by team + "/" + name
	// gen counts the updates and destroys seen here: a read that began
	// before one does not put what it read into the cache.
	gen uint64
}

type cachedValue struct {
	value string
	read  time.Time
}

// NewService returns the service over records, sealing with key; a nil
// key refuses every write and read of a value, saying why (noKeyWhy).
func NewService(records store.SecretStore, key []byte, noKeyWhy string) (*Service, error) {
	s := &Service{records: records, noKeyWhy: noKeyWhy, maxPerTeam: DefaultMaxTeamSecret, cache: map[string]cachedValue{}}
	if key != nil {
		box, err := NewBox(key)
		if err != nil {
			return nil, err
		}
		s.box = box
	}
	return s, nil
}

// CheckName normalises a secret's name (lower case) and checks it.
func CheckName(name string) (string, error) {
	n := strings.ToLower(name)
	switch {
	case n == "":
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "a secret needs a name")
	case len(n) > MaxNameLen:
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "secret name %.40q...: longer than %d characters", n, MaxNameLen)
	case strings.HasPrefix(n, IDPrefix):
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "secret name %q: the %s prefix is for secrets' IDs", n, IDPrefix)
	case !validName.MatchString(n):
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument,
			"secret name %q: letters, digits, '.', '_' and '-', starting with a letter or digit", name)
	}
	return n, nil
}

func checkValue(value string) error {
	switch {
	case value == "":
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "a secret's value must not be empty")
	case len(value) > MaxValueBytes:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "a secret's value is %d bytes, more than %d", len(value), MaxValueBytes)
	case !utf8.ValidString(value) || !httpguts.ValidHeaderFieldValue(value):
		// Values go into HTTP headers: a line break would end the
		// header and start another the sandbox never asked for, and
		// other control characters would fail every request.
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "a secret's value must be UTF-8 text without line breaks or other control characters")
	}
	return nil
}

// CheckMetadata checks metadata against E2B's bounds.
func CheckMetadata(m map[string]string) error {
	if len(m) > MaxMetadataEntries {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "metadata has %d entries, more than %d", len(m), MaxMetadataEntries)
	}
	total := 0
	for k, v := range m {
		switch {
		case k == "":
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "metadata keys must not be empty")
		case len(k) > MaxMetadataKeyBytes:
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "metadata key %.40q...: more than %d bytes", k, MaxMetadataKeyBytes)
		case len(v) > MaxMetadataValBytes:
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "metadata value of %q: more than %d bytes", k, MaxMetadataValBytes)
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "metadata is %d bytes, more than %d", total, MaxMetadataBytes)
	}
	return nil
}

func (s *Service) needKey() error {
	if s.box == nil {
		return errdefs.Errorf(errdefs.ErrNotImplemented, "secrets are off: %s", s.noKeyWhy)
	}
	return nil
}

// Create makes secret name of team holding value.
func (s *Service) Create(ctx context.Context, team, name, value string, metadata map[string]string) (*store.Secret, error) {
	if err := s.needKey(); err != nil {
		return nil, err
	}
	name, err := CheckName(name)
	if err != nil {
		return nil, err
	}
	if err := checkValue(value); err != nil {
		return nil, err
	}
	if err := CheckMetadata(metadata); err != nil {
		return nil, err
	}
	own, err := s.records.ListSecrets(ctx, team)
	if err != nil {
		return nil, err
	}
	if len(own) >= s.maxPerTeam {
		return nil, errdefs.Errorf(errdefs.ErrResourceExhausted,
			"team %s has %d secrets, the most a team may have: destroy some first", team, len(own))
	}
	now := time.Now().UTC()
	if metadata == nil {
		metadata = map[string]string{}
	}
	sec := &store.Secret{ID: IDPrefix + strings.ToLower(rand.Text()[:20]), TeamID: team, Name: name,
		Metadata: metadata, Version: 1, CreatedAt: now, UpdatedAt: now}
	if err := s.records.CreateSecret(ctx, sec, s.box.Seal(sec.ID, []byte(value))); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, errdefs.Errorf(errdefs.ErrConflict, "a secret named %q exists", name)
		}
		return nil, err
	}
	return sec, nil
}

// Get finds secret idOrName as team sees it: by ID, or by name in team
// (any case); another team's is not found, unless admin.
func (s *Service) Get(ctx context.Context, team string, admin bool, idOrName string) (*store.Secret, error) {
	key := idOrName
	if !strings.HasPrefix(key, IDPrefix) {
		key = strings.ToLower(key)
	}
	sec, err := s.records.GetSecret(ctx, team, key)
	if err == nil && !admin && sec.TeamID != team {
		err = store.ErrNotFound
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "secret %q not found", idOrName)
	}
	return sec, err
}

// List lists team's secrets (every team's for ""), oldest first.
func (s *Service) List(ctx context.Context, team string) ([]*store.Secret, error) {
	return s.records.ListSecrets(ctx, team)
}

// Update makes value sec's next version, and replaces its metadata
// unless metadata is nil.
func (s *Service) Update(ctx context.Context, sec *store.Secret, value string, metadata map[string]string) (*store.Secret, error) {
	if err := s.needKey(); err != nil {
		return nil, err
	}
	if err := checkValue(value); err != nil {
		return nil, err
	}
	if err := CheckMetadata(metadata); err != nil {
		return nil, err
	}
	up, err := s.records.UpdateSecret(ctx, sec.ID, s.box.Seal(sec.ID, []byte(value)), metadata, time.Now())
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "secret %q not found", sec.ID)
	}
	if err != nil {
		return nil, err
	}
	s.forget(up.TeamID, up.Name)
	return up, nil
}

// Delete destroys sec and every version of its value.
func (s *Service) Delete(ctx context.Context, sec *store.Secret) error {
	err := s.records.DeleteSecret(ctx, sec.ID)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.Errorf(errdefs.ErrNotFound, "secret %q not found", sec.ID)
	}
	if err != nil {
		return err
	}
	s.forget(sec.TeamID, sec.Name)
	return nil
}

func (s *Service) forget(team, name string) {
	s.mu.Lock()
	delete(s.cache, team+"/"+name)
	s.gen++
	s.mu.Unlock()
}

// ErrUnknown: a placeholder names a secret the team does not have.
var ErrUnknown = errdefs.New(errdefs.ErrInvalidArgument, "unknown secret")

// Value returns the current value of team's secret name, for the egress
// gateway to set into a request (never for an API answer). It is kept
// for cacheTTL: an update here is seen at once, one through another
// member of a cluster within that.
func (s *Service) Value(ctx context.Context, team, name string) (string, error) {
	if err := s.needKey(); err != nil {
		return "", err
	}
	name = strings.ToLower(name)
	k := team + "/" + name
	s.mu.Lock()
	c, ok := s.cache[k]
	gen := s.gen
	s.mu.Unlock()
	if ok && time.Since(c.read) < cacheTTL {
		return c.value, nil
	}
	sec, sealed, err := s.records.SecretValue(ctx, team, name)
	if errors.Is(err, store.ErrNotFound) {
		return "", fmt.Errorf("%w %q", ErrUnknown, name)
	}
	if err != nil {
		return "", err
	}
	value, err := s.box.Open(sec.ID, sealed)
	if err != nil {
		// Not the value's fault, nor the caller's: the operator gave
		// another key than the one that sealed it.
		return "", errdefs.Errorf(errdefs.ErrUnavailable, "secret %q does not open with this server's secrets key: %v", name, err)
	}
	s.mu.Lock()
	if s.gen == gen {
		// Expired values go as new ones come: no value stays in memory
		// much past its use (one destroyed through another member of a
		// cluster is never forgotten here).
		for key, c := range s.cache {
			if time.Since(c.read) >= cacheTTL {
				delete(s.cache, key)
			}
		}
		s.cache[k] = cachedValue{value: string(value), read: time.Now()}
	}
	s.mu.Unlock()
	return string(value), nil
}

// Names returns the secrets' names that the placeholders in text name.
func Names(text string) []string {
	var out []string
	for _, m := range Placeholder.FindAllStringSubmatch(text, -1) {
		out = append(out, strings.ToLower(m[1]))
	}
	return out
}

// Fill replaces every placeholder in text by its secret's value, read by
// value; the first that fails fails it all (a placeholder is never sent
// on as it is).
func Fill(text string, value func(name string) (string, error)) (string, error) {
	var firstErr error
	out := Placeholder.ReplaceAllStringFunc(text, func(p string) string {
		if firstErr != nil {
			return ""
		}
		name := Placeholder.FindStringSubmatch(p)[1]
		v, err := value(name)
		if err != nil {
			firstErr = err
			return ""
		}
		return v
	})
	if firstErr != nil {
		return "", firstErr
	}
	return out, nil
}
