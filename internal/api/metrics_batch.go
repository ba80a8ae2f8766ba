package api

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/usage"
	"github.com/aenv-dev/aenv/internal/wire"
)

// MaxMetricsSandboxes bounds the sandboxes one GET /sandboxes/metrics
// names (E2B's maxItems): a console polls a page of them at a time.
const MaxMetricsSandboxes = 100

// MetricsSandboxIDs is the query parameter of GET /sandboxes/metrics.
const MetricsSandboxIDs = "sandbox_ids"

// recentSamples is how far back the newest sample of a sandbox is looked
// for first: a running sandbox has a few there, and its whole history (an
// hour of samples) is not copied to find the last one.
const recentSamples = time.Minute

// ParseSandboxIDs reads the sandbox IDs of GET /sandboxes/metrics: joined
// by commas, as E2B's SDKs send them (the parameter repeated is read too),
// each kept once, in the order first named. None, or more than
// MaxMetricsSandboxes different ones, is a bad request.
func ParseSandboxIDs(q url.Values) ([]string, error) {
	seen := map[string]bool{}
	var ids []string
	for _, v := range q[MetricsSandboxIDs] {
		for _, id := range strings.Split(v, ",") {
			if id == "" || seen[id] {
				continue
			}
			if len(ids) == MaxMetricsSandboxes {
				return nil, badRequest(fmt.Sprintf("%s names more than %d sandboxes", MetricsSandboxIDs, MaxMetricsSandboxes))
			}
			seen[id] = true
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, badRequest(MetricsSandboxIDs + " must name at least one sandbox ID")
	}
	return ids, nil
}

// batchMetrics serves E2B's GET /sandboxes/metrics: the latest sample of
// each named sandbox the caller may see. A sandbox that is unknown,
// another team's, dead, or without a sample is left out of the map, never
// an error: the answer says no more of an ID than that it has no reading
// for this caller.
func (s *Server) batchMetrics(w http.ResponseWriter, r *http.Request) error {
	ids, err := ParseSandboxIDs(r.URL.Query())
	if err != nil {
		return err
	}
	live, err := s.liveSandboxes(r, ids)
	if err != nil {
		return err
	}
	out := wire.SandboxesWithMetrics{Sandboxes: make(map[string]wire.SandboxMetric, len(live))}
	for _, sb := range live {
		sample, ok, err := s.latestSample(r, sb)
		switch {
		case err != nil:
			// Paused or stopped since the list: it has no reading now.
			s.logger.DebugContext(r.Context(), "batch metrics: no sample", "sandbox", sb.ID, "err", err)
		case ok:
			out.Sandboxes[sb.ID] = toMetric(sample)
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// liveSandboxes returns the records of those of ids that are running or
// paused and that r's caller may see, in one read by their IDs (a console
// polls this every few seconds): its cost is the request's, not the
// team's or the node's number of sandboxes.
func (s *Server) liveSandboxes(r *http.Request, ids []string) ([]*store.Sandbox, error) {
	live, err := s.catalog.List(r.Context(), store.SandboxFilter{TeamID: teamFilter(principal(r)), IDs: ids,
		States: []store.SandboxState{store.StateRunning, store.StatePaused}})
	if err != nil {
		return nil, fmt.Errorf("list live sandboxes: %w", err)
	}
	return live, nil
}

// latestSample is sb's newest reading: the last sample of its history
// (a paused sandbox keeps the ones from before its pause) or, for a
// running sandbox without one yet, one taken now. ok is false when sb has
// none.
func (s *Server) latestSample(r *http.Request, sb *store.Sandbox) (sample usage.Sample, ok bool, err error) {
	if s.cfg.Usage != nil {
		samples := s.cfg.Usage.Range(sb.ID, time.Now().Add(-recentSamples), time.Time{})
		if len(samples) == 0 {
			samples = s.cfg.Usage.Range(sb.ID, time.Time{}, time.Time{})
		}
		if len(samples) > 0 {
			return samples[len(samples)-1], true, nil
		}
	}
	if sb.State != store.StateRunning {
		return usage.Sample{}, false, nil
	}
	sample, err = s.currentSample(r, sb)
	if err != nil {
		return usage.Sample{}, false, fmt.Errorf("sample sandbox %s: %w", sb.ID, err)
	}
	return sample, true, nil
}
