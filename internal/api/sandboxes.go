package api

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/volume"
	"github.com/aenv-dev/aenv/internal/wire"
)

// The shapes of this file are E2B's, declared once in the OpenAPI document
// (api/openapi/aenv.yaml) and generated into internal/wire.

// policy merges both spellings into one policy; nil when the request
// says nothing about egress.
func policyOf(r *wire.NewSandbox) *store.NetworkPolicy {
	allowInternet := r.AllowInternetAccess
	if allowInternet == nil {
		allowInternet = r.AllowInternetAccessE2B
	}
	var allowOut, denyOut []string
	var mask string
	var upstream *store.EgressProxy
	var rules map[string][]store.NetworkRule
	allowOut = append(allowOut, r.AlwaysAllowedCIDRs...)
	allowOut = append(allowOut, r.AlwaysAllowedDomains...)
	denyOut = append(denyOut, r.AlwaysDeniedCIDRs...)
	if r.Network != nil {
		allowOut = append(allowOut, r.Network.AllowOut...)
		denyOut = append(denyOut, r.Network.DenyOut...)
		mask = r.Network.MaskRequestHost
		if e := r.Network.EgressProxy; e != nil {
			upstream = &store.EgressProxy{Address: e.Address, Username: e.Username, Password: e.Password}
		}
		rules = storeRules(r.Network.Rules)
	}
	if allowInternet == nil && len(allowOut) == 0 && len(denyOut) == 0 && mask == "" && upstream == nil && len(rules) == 0 {
		return nil
	}
	p := &store.NetworkPolicy{AllowInternet: true, AllowOut: allowOut, DenyOut: denyOut, MaskRequestHost: mask,
		EgressProxy: upstream, Rules: rules}
	if allowInternet != nil {
		p.AllowInternet = *allowInternet
	}
	return p
}

const clientID = "aenv"

func (s *Server) toSandboxJSON(sb *store.Sandbox) wire.Sandbox {
	out := wire.Sandbox{SandboxID: sb.ID, TemplateID: sb.TemplateID, Alias: sb.Alias, ClientID: clientID,
		EnvdVersion: EnvdVersion, EnvdAccessToken: sb.AccessToken, Domain: s.domain()}
	if sb.TrafficToken != "" {
		out.TrafficAccessToken = &sb.TrafficToken
	}
	return out
}

func (s *Server) domain() *string {
	if s.cfg.Domain == "" {
		return nil
	}
	d := s.cfg.Domain
	return &d
}

func toListed(sb *store.Sandbox) wire.ListedSandbox {
	unresponsive := ""
	if sb.State == store.StateRunning {
		unresponsive = sb.Unresponsive
	}
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return wire.ListedSandbox{SandboxID: sb.ID, TemplateID: sb.TemplateID, Alias: sb.Alias, ClientID: clientID,
		StartedAt: sb.StartedAt, EndAt: sb.EndAt, CpuCount: sb.VCPU, MemoryMB: sb.MemoryMB, Metadata: md,
		State: wire.SandboxState(sb.State), EnvdVersion: EnvdVersion, VolumeMounts: toVolumeMounts(sb.VolumeMounts), NodeID: sb.NodeID,
		Unresponsive: unresponsive}
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req wire.NewSandbox
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	if req.Network != nil && req.Network.MaskRequestHost != "" {
		if err := checkMaskRequestHost(req.Network.MaskRequestHost); err != nil {
			return err
		}
	}
	timeout := time.Duration(0)
	if req.Timeout != nil {
		var err error
		if timeout, err = sandboxTimeout(*req.Timeout, s.cfg.MaxSandboxTimeout); err != nil {
			return err
		}
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return err
	}
	if err := checkEnv("envVars", req.EnvVars); err != nil {
		return err
	}
	req.TemplateID = s.untagged(r, req.TemplateID)
	p := principal(r)
	mounts, err := s.volumeMounts(r, req.VolumeMounts)
	if err != nil {
		return err
	}
	if err := s.usableTemplate(r.Context(), p, req.TemplateID); err != nil {
		return err
	}
	vcpu := req.Vcpu
	if vcpu == 0 {
		vcpu = req.CpuCount
	}
	dropMemory := req.AutoPauseMemory != nil && !*req.AutoPauseMemory
	autoResume := req.AutoResume != nil && req.AutoResume.Enabled
	switch {
	case autoResume && !req.AutoPause:
		return badRequest("autoResume needs autoPause: only a sandbox paused at its deadline can be resumed by traffic")
	case autoResume && dropMemory:
		return badRequest("autoResume cannot be combined with autoPauseMemory false: a sandbox paused without its memory is resumed with connect")
	case dropMemory && !req.AutoPause:
		return badRequest("autoPauseMemory applies only with autoPause")
	}
	private := req.Network != nil && req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic
	insecure := req.Secure != nil && !*req.Secure && !strings.HasPrefix(r.URL.Path, "/v2/")
	if insecure && private {
		return badRequest("a sandbox without public traffic (allowPublicTraffic false) needs secure envd access: drop secure: false")
	}
	policy := policyOf(&req)
	if err := s.checkRuleSecrets(r.Context(), p.TeamID, policy); err != nil {
		return err
	}
	sb, err := s.sandboxes.Create(r.Context(), node.CreateRequest{
		Template: req.TemplateID, VCPU: vcpu, MemoryMB: req.MemoryMB, Timeout: timeout,
		Metadata: req.Metadata, EnvVars: req.EnvVars, AutoPause: req.AutoPause,
		AutoPauseDropMemory: dropMemory, AutoResume: autoResume,
		Network: policy, Private: private, Insecure: insecure, TeamID: p.TeamID,
		VolumeMounts: mounts,
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, s.toSandboxJSON(sb))
	return nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.catalog.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	onTimeout := wire.LifecycleOnTimeoutKill
	if sb.AutoPause {
		onTimeout = wire.LifecycleOnTimeoutPause
	}
	allowInternet := true
	net := wire.NetworkConfig{}
	if sb.Network != nil {
		allowInternet = sb.Network.AllowInternet
		net.AllowOut, net.DenyOut = sb.Network.AllowOut, sb.Network.DenyOut
		net.MaskRequestHost = sb.Network.MaskRequestHost
		if e := sb.Network.EgressProxy; e != nil {
			// Never the password.
			net.EgressProxy = &wire.EgressProxy{Address: e.Address, Username: e.Username}
		}
		net.Rules = wireRules(sb.Network.Rules)
	}
	public := sb.TrafficToken == ""
	net.AllowPublicTraffic = &public
	l := toListed(sb)
	writeJSON(w, http.StatusOK, wire.SandboxDetail{
		SandboxID: l.SandboxID, TemplateID: l.TemplateID, Alias: l.Alias, ClientID: l.ClientID,
		StartedAt: l.StartedAt, EndAt: l.EndAt, CpuCount: l.CpuCount, MemoryMB: l.MemoryMB,
		DiskSizeMB: l.DiskSizeMB, Metadata: l.Metadata, State: l.State, EnvdVersion: l.EnvdVersion,
		VolumeMounts: l.VolumeMounts, NodeID: l.NodeID, Unresponsive: l.Unresponsive,
		EnvdAccessToken: sb.AccessToken, AllowInternetAccess: &allowInternet, Network: net, Domain: s.domain(),
		Lifecycle:   wire.Lifecycle{OnTimeout: onTimeout, AutoResume: sb.AutoResume},
		EndedReason: sb.EndedReason,
	})
	return nil
}

// sandboxEgress serves the egress gateway's log of a sandbox.
func (s *Server) sandboxEgress(w http.ResponseWriter, r *http.Request) error {
	events, err := s.sandboxes.EgressLog(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	out := make([]wire.EgressEvent, 0, len(events))
	for _, e := range events {
		out = append(out, wire.EgressEvent{Time: e.Time.UTC(), Protocol: wire.EgressEventProtocol(e.Protocol), Host: e.Host,
			Address: e.Address, Port: int(e.Port), Upstream: e.Upstream, Verdict: wire.EgressEventVerdict(e.Verdict),
			Rule: e.Rule, Reason: e.Reason, BytesOut: e.BytesOut, BytesIn: e.BytesIn,
			Transform: e.Transform, Requests: e.Requests})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// updateNetwork is E2B's updateNetwork: the whole policy is replaced.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) error {
	var req wire.NetworkUpdate
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	policy := policyOf(&wire.NewSandbox{AllowInternetAccess: req.AllowInternetAccess,
		AllowInternetAccessE2B: req.AllowInternetAccessE2B,
		Network: &wire.NetworkConfig{AllowOut: req.AllowOut, DenyOut: req.DenyOut, EgressProxy: req.EgressProxy,
			Rules: req.Rules}})
	if policy == nil {
		policy = &store.NetworkPolicy{AllowInternet: true}
	}
	// The update replaces the egress rules only: the SDK's update has no
	// maskRequestHost, so the sandbox keeps the one it was created with.
	sb, err := s.catalog.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if sb.Network != nil {
		policy.MaskRequestHost = sb.Network.MaskRequestHost
	}
	if err := s.checkRuleSecrets(r.Context(), sb.TeamID, policy); err != nil {
		return err
	}
	if err := s.sandboxes.UpdateNetwork(r.Context(), r.PathValue("id"), policy); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request) error {
	if err := s.sandboxes.Kill(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	if req.Timeout == nil {
		return badRequest("timeout (seconds) is required")
	}
	timeout, err := sandboxTimeout(*req.Timeout, s.cfg.MaxSandboxTimeout)
	if err != nil {
		return err
	}
	if err := s.sandboxes.SetTimeout(r.Context(), r.PathValue("id"), timeout); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

const (
	defaultListLimit = 100
	maxListLimit     = 100
)

// sandboxListQuery is what a sandbox list asks for.
type sandboxListQuery struct {
	filter       store.SandboxFilter
	startedAfter time.Time // zero: no bound
	ascending    bool
	limit        int
	nextToken    string
}

// parseSandboxListQuery reads E2B's list parameters: state (comma-joined,
// or repeated), metadata, template, startedAfter, order, limit, nextToken.
// States default to running and paused.
func parseSandboxListQuery(q url.Values) (sandboxListQuery, error) {
	lq := sandboxListQuery{nextToken: q.Get("nextToken")}
	lq.filter.States = []store.SandboxState{store.StateRunning, store.StatePaused}
	if v := strings.Join(q["state"], ","); v != "" {
		lq.filter.States = nil
		for _, st := range strings.Split(v, ",") {
			switch state := store.SandboxState(strings.TrimSpace(st)); state {
			case store.StateRunning, store.StatePaused, store.StateDead:
				lq.filter.States = append(lq.filter.States, state)
			default:
				return lq, badRequest(fmt.Sprintf("unknown state %q (running, paused or dead)", st))
			}
		}
	}
	if v := q.Get("metadata"); v != "" {
		md, err := parseMetadataQuery(v)
		if err != nil {
			return lq, err
		}
		lq.filter.Metadata = md
	}
	lq.filter.Template = q.Get("template")
	var err error
	if lq.startedAfter, err = parseTimeQuery(q, "startedAfter"); err != nil {
		return lq, err
	}
	if lq.limit, err = parseLimit(q.Get("limit")); err != nil {
		return lq, err
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		lq.ascending = true
	default:
		return lq, badRequest("order must be asc or desc")
	}
	return lq, nil
}

// listSandboxes serves E2B's paginated list: metadata filters arrive
// URL-encoded (E2B encodes them thrice), and X-Next-Token marks that more
// pages exist.
func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	lq, err := parseSandboxListQuery(r.URL.Query())
	if err != nil {
		return err
	}
	lq.filter.TeamID = teamFilter(principal(r))
	lq.filter.StartedFrom = lq.startedAfter
	lq.filter.Oldest = lq.ascending
	if lq.nextToken != "" {
		at, id, err := parsePageToken(lq.nextToken)
		if err != nil {
			return err
		}
		lq.filter.After = &store.ListCursor{At: at, ID: id}
	}
	// One more than the page: whether it is there says if more follow.
	lq.filter.Limit = lq.limit + 1
	all, err := s.catalog.List(r.Context(), lq.filter)
	if err != nil {
		return err
	}
	if len(all) > lq.limit {
		all = all[:lq.limit]
		last := all[len(all)-1]
		w.Header().Set("X-Next-Token", pageToken(last.StartedAt, last.ID))
	}
	out := make([]wire.ListedSandbox, 0, len(all))
	for _, sb := range all {
		out = append(out, toListed(sb))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// parseTimeQuery reads an optional timestamp parameter: RFC 3339 (what
// the SDK's toISOString sends) or Unix seconds. Absent gives the zero time.
func parseTimeQuery(q url.Values, name string) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 { // E2B's minimum is 0
			return time.Time{}, badRequest(fmt.Sprintf("%s must not be negative Unix seconds", name))
		}
		return time.Unix(n, 0), nil
	}
	return time.Time{}, badRequest(fmt.Sprintf("%s must be an RFC 3339 timestamp or Unix seconds", name))
}

// parseLimit reads a list's page size.
func parseLimit(v string) (int, error) {
	if v == "" {
		return defaultListLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxListLimit {
		return 0, badRequest(fmt.Sprintf("limit must be between 1 and %d", maxListLimit))
	}
	return n, nil
}

// parseMetadataQuery decodes "k=v&k2=v2" whose parts may be URL-encoded
// once more, as the E2B SDK sends them.
func parseMetadataQuery(v string) (map[string]string, error) {
	whole, err := url.QueryUnescape(v)
	if err != nil {
		return nil, badRequest("metadata filter is not URL-encoded correctly")
	}
	md := map[string]string{}
	for _, pair := range strings.Split(whole, "&") {
		if pair == "" {
			continue
		}
		k, val, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, badRequest(fmt.Sprintf("metadata filter %q must be key=value", pair))
		}
		key, err1 := url.QueryUnescape(k)
		value, err2 := url.QueryUnescape(val)
		if err1 != nil || err2 != nil {
			return nil, badRequest("metadata filter is not URL-encoded correctly")
		}
		md[key] = value
	}
	return md, nil
}

func pageToken(startedAt time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(startedAt.UnixNano(), 10) + ":" + id))
}

func parsePageToken(tok string) (time.Time, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return time.Time{}, "", badRequest("invalid nextToken")
	}
	ns, id, ok := strings.Cut(string(raw), ":")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil {
		return time.Time{}, "", badRequest("invalid nextToken")
	}
	return time.Unix(0, n).UTC(), id, nil
}

// toVolumeMounts is the wire's list of a sandbox's mounts: by name, as
// E2B shows them.
func toVolumeMounts(mounts []store.VolumeMount) []wire.SandboxVolumeMount {
	out := make([]wire.SandboxVolumeMount, 0, len(mounts))
	for _, m := range mounts {
		out = append(out, wire.SandboxVolumeMount{Name: m.Name, Path: m.Path, ReadOnly: m.ReadOnly})
	}
	return out
}

// volumeMounts checks a create's volume mounts and finds their volumes,
// by name in the caller's team or by ID, before anything is made: an
// unknown volume is not found, one kept by another node a conflict (a
// gateway places such a create on the volume's node).
func (s *Server) volumeMounts(r *http.Request, asked []wire.SandboxVolumeMount) ([]store.VolumeMount, error) {
	if len(asked) == 0 {
		return nil, nil
	}
	if s.cfg.Volumes == nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "volumeMounts: this server keeps no volumes")
	}
	paths := make([]string, len(asked))
	for i, m := range asked {
		paths[i] = m.Path
	}
	paths, err := volume.CheckMountPaths(paths)
	if err != nil {
		return nil, badRequest("volumeMounts: " + err.Error())
	}
	p := principal(r)
	out := make([]store.VolumeMount, 0, len(asked))
	for i, m := range asked {
		if m.Name == "" {
			return nil, badRequest(fmt.Sprintf("volumeMounts: the mount at %s names no volume", paths[i]))
		}
		// Even an admin's sandbox mounts only its own team's volumes: a
		// sandbox (and a snapshot of it) must not lend another team's.
		v, err := s.cfg.Volumes.Get(r.Context(), p.TeamID, false, m.Name)
		if err != nil {
			return nil, err
		}
		if !s.cfg.Volumes.Local(v) {
			return nil, errdefs.Errorf(errdefs.ErrConflict,
				"volume %s is kept by node %s: create the sandbox there (through a gateway, which places it)", v.Name, v.NodeID)
		}
		out = append(out, store.VolumeMount{VolumeID: v.ID, Name: v.Name, Path: paths[i], ReadOnly: m.ReadOnly})
	}
	return out, nil
}
