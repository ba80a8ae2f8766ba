package postgres

import (
	"bytes"
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/store/postgres/pgtest"
)

// The shared idempotency records: one holder per key, the answer kept for
// replay, a lapsed lease taken over with its note, expired keys claimed
// afresh and cleaned.
func TestIdempotency(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.New(t).NewDatabase(t))
	digest := func(s string) []byte { d := sha256.Sum256([]byte(s)); return d[:] }
	const lease, ttl = time.Minute, 10 * time.Minute
	bodyA, bodyB := digest("a"), digest("b")

	claim := func(key, body []byte, owner string, lease, ttl time.Duration) (bool, string, *IdempotencyRow) {
		t.Helper()
		claimed, prior, row, err := s.ClaimIdempotency(ctx, key, body, owner, lease, ttl)
		if err != nil {
			t.Fatalf("claim %x by %s: %v", key[:4], owner, err)
		}
		return claimed, prior, row
	}
	held := func(what string, ok bool, err error, want bool) {
		t.Helper()
		if err != nil || ok != want {
			t.Fatalf("%s: %v, %v; want %v", what, ok, err, want)
		}
	}

	// A fresh key is claimed; a second caller sees it pending.
	k1 := digest("k1")
	if claimed, prior, _ := claim(k1, bodyA, "g1", lease, ttl); !claimed || prior != "" {
		t.Fatalf("fresh claim: %v %q", claimed, prior)
	}
	claimed, _, row := claim(k1, bodyA, "g2", lease, ttl)
	if claimed || row == nil || row.State != IdempotencyPending || row.Owner != "g1" {
		t.Fatalf("held key claimed again: %v %+v", claimed, row)
	}
	// Another body sees the first body's digest (the caller refuses it).
	if claimed, _, row := claim(k1, bodyB, "g2", lease, ttl); claimed || !bytes.Equal(row.BodySHA256, bodyA) {
		t.Fatalf("other body: %v %+v", claimed, row)
	}
	ok, err := s.NoteIdempotency(ctx, k1, "g2", "node:x")
	held("note by a non-holder", ok, err, false)
	ok, err = s.RenewIdempotency(ctx, k1, "g1", lease)
	held("renew by the holder", ok, err, true)
	ok, err = s.FinishIdempotency(ctx, k1, "g1", 201, map[string][]string{"Content-Type": {"application/json"}},
		[]byte(`{"sandboxID":"sb1"}`), ttl)
	held("finish", ok, err, true)
	claimed, _, row = claim(k1, bodyA, "g2", lease, ttl)
	if claimed || row.State != IdempotencyDone || row.Status != 201 || string(row.Body) != `{"sandboxID":"sb1"}` ||
		row.Header["Content-Type"][0] != "application/json" {
		t.Fatalf("answered key: %v %+v", claimed, row)
	}
	ok, err = s.RenewIdempotency(ctx, k1, "g1", lease)
	held("renew after finish", ok, err, false)

	// A holder whose lease lapsed (lease 0) is taken over, its note handed
	// on; the first holder then holds nothing.
	k2 := digest("k2")
	claim(k2, bodyA, "g1", 0, ttl)
	ok, err = s.NoteIdempotency(ctx, k2, "g1", "node:n1")
	held("note", ok, err, true)
	if claimed, _, _ := claim(k2, bodyB, "g2", lease, ttl); claimed {
		t.Fatal("a lapsed key taken over with another body")
	}
	if claimed, prior, _ := claim(k2, bodyA, "g2", lease, ttl); !claimed || prior != "node:n1" {
		t.Fatalf("takeover: %v %q", claimed, prior)
	}
	ok, err = s.FinishIdempotency(ctx, k2, "g1", 201, nil, nil, ttl)
	held("finish by the holder taken over", ok, err, false)

	// Release: taken over at once; drop: claimed afresh.
	k3 := digest("k3")
	claim(k3, bodyA, "g1", lease, ttl)
	s.NoteIdempotency(ctx, k3, "g1", "fork")
	ok, err = s.ReleaseIdempotency(ctx, k3, "g1")
	held("release", ok, err, true)
	if claimed, prior, _ := claim(k3, bodyA, "g2", lease, ttl); !claimed || prior != "fork" {
		t.Fatalf("after release: %v %q", claimed, prior)
	}
	ok, err = s.DropIdempotency(ctx, k3, "g2")
	held("drop", ok, err, true)
	if claimed, prior, _ := claim(k3, bodyB, "g3", lease, ttl); !claimed || prior != "" {
		t.Fatalf("after drop: %v %q", claimed, prior)
	}

	// Expired (ttl 0): claimed afresh with any body and no note, and
	// cleaned; a live one is not.
	k4 := digest("k4")
	claim(k4, bodyA, "g1", 0, 0)
	s.NoteIdempotency(ctx, k4, "g1", "node:n1")
	if claimed, prior, _ := claim(k4, bodyB, "g2", lease, ttl); !claimed || prior != "" {
		t.Fatalf("expired key: %v %q", claimed, prior)
	}
	k5 := digest("k5")
	claim(k5, bodyA, "g1", 0, 0)
	n, err := s.DeleteExpiredIdempotency(ctx)
	if err != nil || n != 1 {
		t.Fatalf("delete expired: %d, %v; want 1", n, err)
	}
	if claimed, _, _ := claim(k1, bodyA, "g9", lease, ttl); claimed {
		t.Fatal("a live answer was cleaned")
	}
}
