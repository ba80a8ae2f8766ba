package postgres

import (
	"context"
	"encoding/hex"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// States of an idempotency row.
const (
	IdempotencyPending = "pending" // a gateway is running the request
	IdempotencyDone    = "done"    // the answer is kept for replay
)

// IdempotencyRow is the record of a request that carried an
// Idempotency-Key (see migrations/0006_idempotency.sql).
type IdempotencyRow struct {
	BodySHA256 []byte
	State      string
	Owner      string
	Note       string
	Status     int
	Header     map[string][]string
	Body       []byte
}

// ClaimIdempotency makes owner the holder of key for a request whose
// body has digest bodySHA256, for lease: a key never seen or expired is
// claimed afresh (prior ""); a pending one whose holder let its lease
// run out, with the same body, is taken over (prior is what that holder
// noted; the key keeps its expiry, so that takeovers never hold it for
// ever). When the key is held or answered, claimed is false and row is
// its record (nil if it went away meanwhile: claim again).
func (s *Store) ClaimIdempotency(ctx context.Context, key, bodySHA256 []byte, owner string, lease, ttl time.Duration) (
	claimed bool, prior string, row *IdempotencyRow, err error) {
	err = s.pool.QueryRow(ctx, `INSERT INTO idempotency AS i (key, body_sha256, state, owner, lease_until, expires_at)
		VALUES ($1, $2, 'pending', $3, now() + make_interval(secs => $4), now() + make_interval(secs => $5))
		ON CONFLICT (key) DO UPDATE SET
			note = CASE WHEN i.expires_at <= now() THEN '' ELSE i.note END,
			body_sha256 = EXCLUDED.body_sha256, state = 'pending', owner = EXCLUDED.owner,
			lease_until = EXCLUDED.lease_until,
			expires_at = CASE WHEN i.expires_at <= now() THEN EXCLUDED.expires_at ELSE i.expires_at END,
			status = 0, header = '{}', body = ''
		WHERE i.expires_at <= now()
			OR (i.state = 'pending' AND i.lease_until <= now() AND i.body_sha256 = EXCLUDED.body_sha256)
		RETURNING note`, key, bodySHA256, owner, lease.Seconds(), ttl.Seconds()).Scan(&prior)
	if err == nil {
		return true, prior, nil, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return false, "", nil, dbError("claim idempotency key: %w", err)
	}
	row = &IdempotencyRow{}
	err = s.pool.QueryRow(ctx, `SELECT body_sha256, state, owner, note, status, header, body
		FROM idempotency WHERE key = $1`, key).
		Scan(&row.BodySHA256, &row.State, &row.Owner, &row.Note, &row.Status, &row.Header, &row.Body)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, "", nil, nil
	}
	if err != nil {
		return false, "", nil, dbError("read idempotency key: %w", err)
	}
	// A kept answer may hold a sandbox's tokens: it is sealed (secrets.go).
	body, err := s.box.open(colReplayBody, hex.EncodeToString(key), string(row.Body))
	if err != nil {
		return false, "", nil, dbError("read idempotency key: %w", err)
	}
	row.Body = []byte(body)
	return false, "", row, nil
}

// RenewIdempotency extends owner's lease on key; false when owner no
// longer holds it (taken over, or settled).
func (s *Store) RenewIdempotency(ctx context.Context, key []byte, owner string, lease time.Duration) (bool, error) {
	return s.updateHeld(ctx, "renew", `UPDATE idempotency SET lease_until = now() + make_interval(secs => $3),
		expires_at = greatest(expires_at, now() + make_interval(secs => $3))
		WHERE key = $1 AND owner = $2 AND state = 'pending'`, key, owner, lease.Seconds())
}

// NoteIdempotency records, for whoever takes key over should owner die,
// what owner is about to do.
func (s *Store) NoteIdempotency(ctx context.Context, key []byte, owner, note string) (bool, error) {
	return s.updateHeld(ctx, "note", `UPDATE idempotency SET note = $3
		WHERE key = $1 AND owner = $2 AND state = 'pending'`, key, owner, note)
}

// FinishIdempotency keeps owner's answer to key for ttl.
func (s *Store) FinishIdempotency(ctx context.Context, key []byte, owner string, status int,
	header map[string][]string, body []byte, ttl time.Duration) (bool, error) {
	if header == nil {
		header = map[string][]string{}
	}
	sealed, err := s.box.seal(colReplayBody, hex.EncodeToString(key), string(body))
	if err != nil {
		return false, dbError("finish idempotency key: %w", err)
	}
	return s.updateHeld(ctx, "finish", `UPDATE idempotency SET state = 'done', status = $3, header = $4, body = $5,
		expires_at = now() + make_interval(secs => $6)
		WHERE key = $1 AND owner = $2 AND state = 'pending'`, key, owner, status, header, []byte(sealed), ttl.Seconds())
}

// DropIdempotency forgets key, held by owner, whose request made nothing:
// its retry runs afresh.
func (s *Store) DropIdempotency(ctx context.Context, key []byte, owner string) (bool, error) {
	return s.updateHeld(ctx, "drop", `DELETE FROM idempotency
		WHERE key = $1 AND owner = $2 AND state = 'pending'`, key, owner)
}

// ReleaseIdempotency ends owner's lease on key without an answer: the
// next retry takes it over at once, with its note.
func (s *Store) ReleaseIdempotency(ctx context.Context, key []byte, owner string) (bool, error) {
	return s.updateHeld(ctx, "release", `UPDATE idempotency SET lease_until = now()
		WHERE key = $1 AND owner = $2 AND state = 'pending'`, key, owner)
}

func (s *Store) updateHeld(ctx context.Context, what, sql string, args ...any) (bool, error) {
	tag, err := s.pool.Exec(ctx, sql, args...)
	if err != nil {
		return false, dbError("%s idempotency key: %w", what, err)
	}
	return tag.RowsAffected() == 1, nil
}

// DeleteExpiredIdempotency removes the records past their expiry that
// nobody holds, and returns how many.
func (s *Store) DeleteExpiredIdempotency(ctx context.Context) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM idempotency
		WHERE expires_at <= now() AND (state = 'done' OR lease_until <= now())`)
	if err != nil {
		return 0, dbError("delete expired idempotency keys: %w", err)
	}
	return tag.RowsAffected(), nil
}
