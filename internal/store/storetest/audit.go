package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/audit"
)

// RunAudit runs the shared suite of the audit log: appends keep every
// field, lists filter and page newest first, and purges drop only what is
// older than asked.
func RunAudit(t *testing.T, newStore func(t *testing.T) audit.Store) {
	ctx := context.Background()
	s := newStore(t)
	t0 := time.Unix(1700000000, 123).UTC()
	var events []audit.Event
	for i := range 10 {
		team := "lab-a"
		if i%2 == 1 {
			team = "lab-b"
		}
		events = append(events, audit.Event{At: t0.Add(time.Duration(i) * time.Minute), TeamID: team,
			KeyID: fmt.Sprintf("k%d", i), KeyName: "trainer", Admin: i == 0, Action: "POST /sandboxes",
			Object: fmt.Sprintf("sb%d", i), Status: 201, Remote: "10.0.0.1", RequestID: fmt.Sprintf("r%d", i)})
	}
	events[3].Action, events[3].Status = "DELETE /sandboxes/{id}", 404
	if err := s.AppendAudit(ctx, events[:4]); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendAudit(ctx, events[4:]); err != nil {
		t.Fatal(err)
	}
	all, err := s.ListAudit(ctx, audit.Filter{Limit: 100})
	if err != nil || len(all) != 10 {
		t.Fatalf("list all: %d events, %v", len(all), err)
	}
	for i, e := range all {
		want := events[9-i]
		want.Seq = e.Seq
		if e != want {
			t.Fatalf("event %d: %+v, want %+v (newest first, every field kept)", i, e, want)
		}
		if i > 0 && e.Seq >= all[i-1].Seq {
			t.Fatalf("seq not decreasing: %d after %d", e.Seq, all[i-1].Seq)
		}
	}
	for _, tc := range []struct {
		name string
		f    audit.Filter
		want []string // objects, newest first
	}{
		{"team", audit.Filter{TeamID: "lab-b", Limit: 3}, []string{"sb9", "sb7", "sb5"}},
		{"action", audit.Filter{Action: "DELETE /sandboxes/{id}", Limit: 10}, []string{"sb3"}},
		{"object", audit.Filter{Object: "sb4", Limit: 10}, []string{"sb4"}},
		{"since and until", audit.Filter{Since: t0.Add(2 * time.Minute), Until: t0.Add(4 * time.Minute), Limit: 10}, []string{"sb3", "sb2"}},
		{"page", audit.Filter{Before: all[2].Seq, Limit: 2}, []string{"sb6", "sb5"}},
		{"nothing", audit.Filter{TeamID: "nobody", Limit: 10}, []string{}},
	} {
		got, err := s.ListAudit(ctx, tc.f)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		objects := []string{}
		for _, e := range got {
			objects = append(objects, e.Object)
		}
		if fmt.Sprint(objects) != fmt.Sprint(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, objects, tc.want)
		}
	}
	n, err := s.PurgeAudit(ctx, t0.Add(5*time.Minute))
	if err != nil || n != 5 {
		t.Fatalf("purge: %d, %v; want 5", n, err)
	}
	if left, _ := s.ListAudit(ctx, audit.Filter{Limit: 100}); len(left) != 5 || left[4].Object != "sb5" {
		t.Fatalf("after the purge: %v", left)
	}
}
