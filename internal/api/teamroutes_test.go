package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
	"github.com/aenv-dev/aenv/internal/wire"
)

// storeNode lists and kills the sandboxes of a real store, as a node
// does with its own.
type storeNode struct {
	noNode
	st *sqlite.Store
}

func (n storeNode) List(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error) {
	return n.st.ListSandboxes(ctx, f)
}

func (n storeNode) Kill(ctx context.Context, id string) error {
	sb, err := n.st.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	sb.State = store.StateDead
	return n.st.UpdateSandbox(ctx, sb)
}

// landingCreates is the store's teams, where a create of the team's lands
// just before each of the first `rounds` deletes: one that passed its
// key's check before a forced delete revoked the keys. It makes a sandbox,
// or a volume if volumes is set.
type landingCreates struct {
	*sqlite.Store
	rounds  int
	volumes bool
	landed  []string
	deletes int
}

func (l *landingCreates) DeleteTeam(ctx context.Context, id string) error {
	l.deletes++
	if len(l.landed) < l.rounds {
		name := fmt.Sprintf("late-%d", len(l.landed))
		var err error
		if l.volumes {
			err = l.Store.CreateVolume(ctx, &store.Volume{ID: name, Name: name, TeamID: id, Token: "t", CreatedAt: time.Now()})
		} else {
			err = l.Store.CreateSandbox(ctx, &store.Sandbox{ID: name, TeamID: id, TemplateID: "base",
				State: store.StateStarting, StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour)})
		}
		if err != nil {
			return err
		}
		l.landed = append(l.landed, name)
	}
	return l.Store.DeleteTeam(ctx, id)
}

// TestDeleteTeamForcedKillsLateCreates: a forced delete kills the
// sandboxes a create recorded after its listing, and deletes the team; a
// delete that is not forced is refused; creates landing at every round
// leave the team, with 409, after a bounded number of rounds; a volume
// made meanwhile leaves it at once (no kill helps).
func TestDeleteTeamForcedKillsLateCreates(t *testing.T) {
	tests := []struct {
		name        string
		force       bool
		late        int
		volumes     bool
		wantStatus  int
		wantKilled  []string
		wantDeletes int
	}{
		{"forced, one late create", true, 1, false, 200, []string{"sb-1", "late-0"}, 2},
		{"forced, late creates every round", true, forcedDeleteRounds, false, 409, nil, forcedDeleteRounds},
		{"forced, a late volume", true, 1, true, 409, nil, 1},
		{"not forced", false, 0, false, 409, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "aenv.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			if err := st.CreateTeam(ctx, &auth.Team{ID: "lab", CreatedAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
			if err := st.CreateSandbox(ctx, &store.Sandbox{ID: "sb-1", TeamID: "lab", TemplateID: "base",
				State: store.StateRunning, StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
			teams := &landingCreates{Store: st, rounds: tt.late, volumes: tt.volumes}
			s := New(Config{APIKey: "key", MaxJSONBytes: 1 << 20, Teams: teams}, storeNode{st: st},
				slog.New(slog.DiscardHandler), prometheus.NewRegistry(), http.NotFoundHandler())
			srv := httptest.NewServer(s)
			t.Cleanup(srv.Close)

			path := "/teams/lab"
			if tt.force {
				path += "?force=true"
			}
			status, body := callRaw(t, "DELETE", srv.URL+path, "")
			if status != tt.wantStatus {
				t.Fatalf("DELETE %s: %d %s, want %d", path, status, body, tt.wantStatus)
			}
			if teams.deletes != tt.wantDeletes {
				t.Errorf("the store was asked to delete the team %d times, want %d", teams.deletes, tt.wantDeletes)
			}
			_, getErr := st.GetTeam(ctx, "lab")
			if tt.wantStatus != 200 {
				if getErr != nil {
					t.Errorf("team after a refused delete: %v", getErr)
				}
				return
			}
			var out wire.DeletedTeam
			if err := json.Unmarshal(body, &out); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(out.Killed, tt.wantKilled) {
				t.Errorf("killed %v, want %v", out.Killed, tt.wantKilled)
			}
			if getErr == nil {
				t.Error("the team is still there")
			}
			live, err := st.ListSandboxes(ctx, store.SandboxFilter{TeamID: "lab", States: liveStates})
			if err != nil || len(live) > 0 {
				t.Errorf("live sandboxes of the deleted team: %d, %v", len(live), err)
			}
		})
	}
}
