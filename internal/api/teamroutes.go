package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/wire"
)

// routeTeams registers the team and key routes, over cfg.Teams.
func (s *Server) routeTeams() {
	if s.cfg.Teams == nil {
		return
	}
	s.route("POST /teams", s.createTeam)
	s.route("GET /teams", s.listTeams)
	s.route("GET /teams/{team}", s.getTeam)
	s.route("PATCH /teams/{team}", s.setTeamLimits)
	s.route("DELETE /teams/{team}", s.deleteTeam)
	s.route("POST /api-keys", s.createKey)
	s.route("GET /api-keys", s.listKeys)
	s.route("GET /api-keys/current", s.currentKey)
	s.route("DELETE /api-keys/{key}", s.revokeKey)
}

func toTeamJSON(t *auth.Team) wire.Team {
	return wire.Team{TeamID: t.ID, CreatedAt: t.CreatedAt, MaxSandboxes: t.MaxSandboxes,
		MaxMemoryMB: t.MaxMemoryMB, MaxVCPUs: t.MaxVCPUs, MaxStarting: t.MaxStarting, CreatesPerSecond: t.CreatesPerSecond,
		MaxSnapshots: t.MaxSnapshots, MaxVolumes: t.MaxVolumes, MaxVolumeMB: t.MaxVolumeMB, MaxSnapshotMB: t.MaxSnapshotMB}
}

func toKeyJSON(k *auth.Key) wire.APIKey {
	return wire.APIKey{Id: k.ID, TeamID: k.TeamID, Name: k.Name, Prefix: k.Prefix, Admin: k.Admin,
		CreatedAt: k.CreatedAt, ExpiresAt: timeOrNil(k.ExpiresAt), LastUsed: timeOrNil(k.LastUsedAt),
		RevokedAt: timeOrNil(k.RevokedAt)}
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

var errAdminOnly = errdefs.New(errdefs.ErrPermissionDenied, "only an admin key may do this")

func (s *Server) createTeam(w http.ResponseWriter, r *http.Request) error {
	if !principal(r).Admin {
		return errAdminOnly
	}
	var req wire.NewTeam
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	if err := auth.ValidTeamID(req.TeamID); err != nil {
		return err
	}
	t := &auth.Team{ID: req.TeamID, CreatedAt: time.Now().UTC(), MaxSandboxes: req.MaxSandboxes,
		MaxMemoryMB: req.MaxMemoryMB, MaxVCPUs: req.MaxVCPUs, MaxStarting: req.MaxStarting,
		CreatesPerSecond: req.CreatesPerSecond, MaxSnapshots: req.MaxSnapshots, MaxVolumes: req.MaxVolumes,
		MaxVolumeMB: req.MaxVolumeMB, MaxSnapshotMB: req.MaxSnapshotMB}
	if err := auth.ValidLimits(t); err != nil {
		return err
	}
	if _, err := s.cfg.Teams.GetTeam(r.Context(), t.ID); err == nil {
		return errdefs.Errorf(errdefs.ErrConflict, "team %q already exists", t.ID)
	}
	if err := s.leftovers(r, t.ID); err != nil {
		return err
	}
	if err := s.cfg.Teams.CreateTeam(r.Context(), t); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return errdefs.Errorf(errdefs.ErrConflict, "team %q already exists", req.TeamID)
		}
		return err
	}
	writeJSON(w, http.StatusCreated, toTeamJSON(t))
	return nil
}

func (s *Server) listTeams(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	if !p.Admin {
		t, err := s.cfg.Teams.GetTeam(r.Context(), p.TeamID)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, []wire.Team{toTeamJSON(t)})
		return nil
	}
	teams, err := s.cfg.Teams.ListTeams(r.Context())
	if err != nil {
		return err
	}
	out := make([]wire.Team, 0, len(teams))
	for _, t := range teams {
		out = append(out, toTeamJSON(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// currentKey is GET /api-keys/current: who the calling key acts for.
func (s *Server) currentKey(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	c := wire.Caller{TeamID: p.TeamID, KeyName: p.KeyName, Admin: p.Admin}
	if p.KeyID != "" {
		c.KeyID = &p.KeyID
	}
	writeJSON(w, http.StatusOK, c)
	return nil
}

func (s *Server) getTeam(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("team")
	if !principal(r).Sees(id) {
		return errdefs.Errorf(errdefs.ErrNotFound, "team %q not found", id)
	}
	t, err := s.cfg.Teams.GetTeam(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.Errorf(errdefs.ErrNotFound, "team %q not found", id)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toTeamJSON(t))
	return nil
}

// leftovers refuses a team ID that objects of a deleted team of that ID
// still carry: a new team must not inherit another's snapshots and
// templates.
func (s *Server) leftovers(r *http.Request, id string) error {
	sandboxes, err := s.catalog.List(r.Context(), store.SandboxFilter{TeamID: id, States: liveStates})
	if err != nil {
		return err
	}
	templates, err := s.catalog.ListTemplates(r.Context())
	if err != nil {
		return err
	}
	owned := 0
	for _, t := range templates {
		if t.TeamID == id {
			owned++
		}
	}
	volumes, err := s.teamVolumes(r, id)
	if err != nil {
		return err
	}
	if len(sandboxes) > 0 || owned > 0 || volumes > 0 {
		return errdefs.Errorf(errdefs.ErrConflict,
			"a deleted team %q left %d sandboxes, %d templates or snapshots and %d volumes: delete them first, or choose another ID",
			id, len(sandboxes), owned, volumes)
	}
	return nil
}

// teamVolumes counts team's volumes.
func (s *Server) teamVolumes(r *http.Request, team string) (int, error) {
	if s.cfg.VolumeRecords == nil {
		return 0, nil
	}
	vs, err := s.cfg.VolumeRecords.ListVolumes(r.Context(), team)
	return len(vs), err
}

// setTeamLimits is PATCH /teams/{team}: the limits given change, the
// others keep their values. A new limit applies to creates from then on;
// sandboxes over it are not killed.
func (s *Server) setTeamLimits(w http.ResponseWriter, r *http.Request) error {
	if !principal(r).Admin {
		return errAdminOnly
	}
	var req wire.TeamLimits
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	id := r.PathValue("team")
	patch := auth.LimitsPatch{MaxSandboxes: req.MaxSandboxes, MaxMemoryMB: req.MaxMemoryMB, MaxVCPUs: req.MaxVCPUs,
		MaxStarting: req.MaxStarting, CreatesPerSecond: req.CreatesPerSecond, MaxSnapshots: req.MaxSnapshots,
		MaxVolumes: req.MaxVolumes, MaxVolumeMB: req.MaxVolumeMB, MaxSnapshotMB: req.MaxSnapshotMB}
	// The limits are independent: the values given are checked alone
	// (those not given keep theirs, valid when written).
	var given auth.Team
	patch.Apply(&given)
	if err := auth.ValidLimits(&given); err != nil {
		return err
	}
	// One write of the limits named, not a read and a write back of all
	// five: two admins changing different limits at once both hold.
	if err := s.cfg.Teams.SetTeamLimits(r.Context(), id, patch); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.Errorf(errdefs.ErrNotFound, "team %q not found", id)
		}
		return err
	}
	return s.getTeam(w, r)
}

// revokeTeamKeys revokes every usable key of team.
func (s *Server) revokeTeamKeys(ctx context.Context, team string) error {
	keys, err := s.cfg.Teams.ListKeys(ctx, team)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, k := range keys {
		if k.RevokedAt.IsZero() {
			if err := s.cfg.Teams.RevokeKey(ctx, k.ID, now); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return fmt.Errorf("revoke key %s of team %s: %w", k.ID, team, err)
			}
		}
	}
	return nil
}

// sandboxKiller kills sandboxes: a node, or a gateway's catalog, which
// asks the nodes holding them.
type sandboxKiller interface {
	Kill(ctx context.Context, id string) error
}

// forcedDeleteRounds bounds how often a forced team delete lists and kills
// the team's sandboxes before it gives up with 409.
const forcedDeleteRounds = 3

// killTeamSandboxes kills the live sandboxes of team id, adding each to
// out.Killed.
func (s *Server) killTeamSandboxes(ctx context.Context, id string, live []*store.Sandbox, out *wire.DeletedTeam) error {
	var killer sandboxKiller = s.sandboxes
	if s.sandboxes == nil {
		k, ok := s.catalog.(sandboxKiller)
		if !ok {
			return errdefs.Errorf(errdefs.ErrConflict, "team %q has %d sandboxes; kill them first", id, len(live))
		}
		killer = k
	}
	for _, sb := range live {
		if err := killer.Kill(ctx, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("kill sandbox %s of team %s (killed before it: %v): %w", sb.ID, id, out.Killed, err)
		}
		// A record a round listed again (its kill found it gone before
		// its record was) is named once.
		if !slices.Contains(out.Killed, sb.ID) {
			out.Killed = append(out.Killed, sb.ID)
		}
	}
	return nil
}

// liveStates are those of sandboxes that hold resources.
var liveStates = []store.SandboxState{store.StateStarting, store.StateRunning, store.StatePaused}

// deleteTeam deletes a team and its keys. A team with sandboxes is kept
// (409) unless force=true, which kills them first (a gateway asks the
// nodes holding them). Its templates and snapshots stay, seen by admins
// only.
func (s *Server) deleteTeam(w http.ResponseWriter, r *http.Request) error {
	if !principal(r).Admin {
		return errAdminOnly
	}
	id := r.PathValue("team")
	if id == auth.DefaultTeam {
		return errdefs.Errorf(errdefs.ErrConflict, "the %s team cannot be deleted", auth.DefaultTeam)
	}
	if _, err := s.cfg.Teams.GetTeam(r.Context(), id); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.Errorf(errdefs.ErrNotFound, "team %q not found", id)
		}
		return err
	}
	// Volumes hold data and a token of their own each: they are deleted
	// one by one, never by a team's delete, force or not.
	if n, err := s.teamVolumes(r, id); err != nil {
		return err
	} else if n > 0 {
		return errdefs.Errorf(errdefs.ErrConflict, "team %q has %d volumes; delete them first (their data goes with them)", id, n)
	}
	force := r.URL.Query().Get("force") == "true"
	out := wire.DeletedTeam{TeamID: id, Killed: []string{}}
	revoked := false
	var inUse error
	for round := 1; ; round++ {
		live, err := s.catalog.List(r.Context(), store.SandboxFilter{TeamID: id, States: liveStates})
		if err != nil {
			return err
		}
		if inUse != nil && len(live) == 0 {
			// What keeps the team is no sandboxes (a volume made
			// meanwhile): killing again would not help.
			return inUse
		}
		if len(live) > 0 {
			if !force {
				return errdefs.Errorf(errdefs.ErrConflict,
					"team %q has %d sandboxes; kill them first, or delete with force=true to kill them", id, len(live))
			}
			// Its keys stop first, so that none makes a sandbox while the
			// others are killed (one by one, over the network on a gateway).
			if !revoked {
				if err := s.revokeTeamKeys(r.Context(), id); err != nil {
					return err
				}
				revoked = true
			}
			if err := s.killTeamSandboxes(r.Context(), id, live, &out); err != nil {
				return err
			}
		}
		err = s.cfg.Teams.DeleteTeam(r.Context(), id)
		// A create that passed its key's check before the revoke can land
		// after the listing; the delete's transaction counts it, and a
		// forced delete kills it too. The keys being revoked, a few rounds
		// see the last of them.
		if force && errors.Is(err, store.ErrTeamInUse) && round < forcedDeleteRounds {
			inUse = err
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	var req wire.NewAPIKey
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	if req.TeamID == "" {
		req.TeamID = p.TeamID
	}
	switch {
	case !p.Admin && req.Admin:
		return errAdminOnly
	case !p.Sees(req.TeamID):
		return errdefs.Errorf(errdefs.ErrNotFound, "team %q not found", req.TeamID)
	case req.ExpiresIn < 0 || req.ExpiresIn > int64(MaxKeyLifetime/time.Second):
		return badRequest(fmt.Sprintf("expiresIn must be between 0 (never) and %d seconds", int64(MaxKeyLifetime/time.Second)))
	}
	if _, err := s.cfg.Teams.GetTeam(r.Context(), req.TeamID); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.Errorf(errdefs.ErrNotFound, "team %q not found", req.TeamID)
		}
		return err
	}
	now := time.Now()
	ttl := time.Duration(req.ExpiresIn) * time.Second
	if !p.Admin {
		// A team's key makes no key that outlives it: revoking or
		// letting a leaked key expire must not leave a longer one behind.
		until, err := s.keyExpiry(r, p)
		if err != nil {
			return err
		}
		if !until.IsZero() && (ttl == 0 || now.Add(ttl).After(until)) {
			ttl = until.Sub(now)
			if ttl <= 0 {
				return errdefs.Errorf(errdefs.ErrUnauthenticated, "this key has expired")
			}
		}
	}
	if err := s.roomForKey(r, req.TeamID, now); err != nil {
		return err
	}
	value, k, err := auth.NewKey(req.TeamID, req.Name, req.Admin, now, ttl)
	if err != nil {
		return err
	}
	if err := s.cfg.Teams.CreateKey(r.Context(), k); err != nil {
		return err
	}
	j := toKeyJSON(k)
	writeJSON(w, http.StatusCreated, wire.CreatedAPIKey{Id: j.Id, TeamID: j.TeamID, Name: j.Name, Prefix: j.Prefix,
		Admin: j.Admin, CreatedAt: j.CreatedAt, ExpiresAt: j.ExpiresAt, Key: value})
	return nil
}

// keyExpiry is when the key r is made with expires (zero: never).
func (s *Server) keyExpiry(r *http.Request, p auth.Principal) (time.Time, error) {
	k, err := s.cfg.Teams.GetKey(r.Context(), p.KeyID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return time.Time{}, errdefs.Errorf(errdefs.ErrUnauthenticated, "this key no longer exists")
	}
	if err != nil {
		return time.Time{}, err
	}
	return k.ExpiresAt, nil
}

// roomForKey refuses a key past MaxTeamKeys usable keys of team.
func (s *Server) roomForKey(r *http.Request, team string, now time.Time) error {
	keys, err := s.cfg.Teams.ListKeys(r.Context(), team)
	if err != nil {
		return err
	}
	usable := 0
	for _, k := range keys {
		if k.Usable(now) {
			usable++
		}
	}
	if usable >= auth.MaxTeamKeys {
		return errdefs.Errorf(errdefs.ErrResourceExhausted,
			"team %q has %d usable keys, its limit: revoke some first", team, usable)
	}
	return nil
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	team := r.URL.Query().Get("teamID")
	if !p.Admin {
		if team != "" && team != p.TeamID {
			return errdefs.Errorf(errdefs.ErrNotFound, "team %q not found", team)
		}
		team = p.TeamID
	}
	keys, err := s.cfg.Teams.ListKeys(r.Context(), team)
	if err != nil {
		return err
	}
	out := make([]wire.APIKey, 0, len(keys))
	for _, k := range keys {
		if k.Admin && !p.Admin {
			continue // the operator's keys are not a team's to see
		}
		out = append(out, toKeyJSON(k))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// revokeKey revokes a key: every gateway and node refuses it within a
// second (they confirm keys at least that often).
func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	id := r.PathValue("key")
	k, err := s.cfg.Teams.GetKey(r.Context(), id)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	// A team's key revokes its team's keys, never an admin's.
	if err != nil || !p.Sees(k.TeamID) || (k.Admin && !p.Admin) {
		return errdefs.Errorf(errdefs.ErrNotFound, "API key %q not found", id)
	}
	if err := s.cfg.Teams.RevokeKey(r.Context(), id, time.Now()); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// teamFilter is the team whose objects p lists: every team's ("") for an
// admin.
func teamFilter(p auth.Principal) string {
	if p.Admin {
		return ""
	}
	return p.TeamID
}
