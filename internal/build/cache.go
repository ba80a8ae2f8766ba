package build

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// Step cache. After a RUN or COPY step that took at least StepCacheMin,
// the build sandbox is snapshotted under a name made of the template's
// name and the step's cache key. A later build of the template whose
// steps up to there have the same keys starts from the latest such
// snapshot instead of the base, and logs the steps before it as CACHED.
// Cheap steps are not kept: running them again costs less than a
// snapshot. The names make the cache survive a restart; a successful
// build removes the entries that are not on its own chain.

// stepCacheInfix separates a template's name from a step key.
const stepCacheInfix = ".step-"

// keyChars is how much of a step's key its snapshot's name carries.
const keyChars = 20

// stepCacheName names the snapshot after the step with key; "" when the
// template's name leaves no room for it.
func stepCacheName(templateID, key string) string {
	name := templateID + stepCacheInfix + key[:keyChars]
	if template.CheckName(name) != nil {
		return ""
	}
	return name
}

// isStepCacheOf reports whether name is one of templateID's cached steps
// (not one of a template whose own name merely starts the same way).
func isStepCacheOf(name, templateID string) bool {
	key, ok := strings.CutPrefix(name, templateID+stepCacheInfix)
	return ok && len(key) == keyChars && strings.Trim(key, "0123456789abcdef") == ""
}

func snapshotRequest(sandboxID, name string) node.SnapshotRequest {
	return node.SnapshotRequest{SandboxID: sandboxID, Name: name, Kind: store.KindSnapshot}
}

func (s *Service) worthCaching(step Step, took time.Duration) bool {
	return (step.Type == StepRun || step.Type == StepCopy) && took >= s.cfg.StepCacheMin
}

// cachedPrefix finds the longest run of leading steps a snapshot holds:
// it returns how many steps it covers and the snapshot (nil: none). A
// forced step, and every step after it, runs again.
// Only the build's own team's cached steps count: another team's, under
// the same name, are not its to start from.
func (s *Service) cachedPrefix(ctx context.Context, b *build, spec Spec, keys []string) (int, *store.Template) {
	if spec.Force {
		return 0, nil
	}
	usable := len(keys)
	for i, st := range spec.Steps {
		if st.Force {
			usable = i
			break
		}
	}
	for i := usable - 1; i >= 0; i-- {
		name := stepCacheName(b.templateID, keys[i])
		if name == "" {
			return 0, nil
		}
		if tpl, err := s.node.GetTemplate(ctx, name); err == nil && tpl.Kind == store.KindSnapshot && tpl.TeamID == b.team {
			return i + 1, tpl
		}
	}
	return 0, nil
}

// maxCachedSteps bounds the cached steps of one template: failed builds
// keep theirs (a fixed step then runs on top of them), so they add up
// until a build succeeds.
const maxCachedSteps = 16

// cacheStep keeps the sandbox's state after the step with key (of the
// chain keys). A failure only costs a later build time, so it is logged,
// not returned.
func (s *Service) cacheStep(ctx context.Context, b *build, sandboxID, key string, chain []string) {
	name := stepCacheName(b.templateID, key)
	if name == "" {
		return
	}
	if _, err := s.node.GetTemplate(ctx, name); err == nil {
		return
	}
	if _, err := s.node.Snapshot(ctx, snapshotRequest(sandboxID, name)); err != nil {
		s.logger.WarnContext(ctx, "keep build step", "template", b.templateID, "name", name, "err", err)
		return
	}
	s.boundStepCache(ctx, b.templateID, chain)
}

// boundStepCache removes the oldest cached steps of a template beyond
// maxCachedSteps, sparing those on chain.
func (s *Service) boundStepCache(ctx context.Context, templateID string, chain []string) {
	all, err := s.node.ListTemplates(ctx)
	if err != nil {
		return
	}
	onChain := map[string]bool{}
	for _, k := range chain {
		onChain[stepCacheName(templateID, k)] = true
	}
	var others []*store.Template
	count := 0
	for _, t := range all {
		if t.Kind == store.KindSnapshot && isStepCacheOf(t.Name, templateID) {
			count++
			if !onChain[t.Name] {
				others = append(others, t)
			}
		}
	}
	sort.Slice(others, func(i, j int) bool { return others[i].CreatedAt.Before(others[j].CreatedAt) })
	for i := 0; count > maxCachedSteps && i < len(others); i++ {
		s.dropTemplate(ctx, others[i].ID)
		count--
	}
}

// pruneStepCache removes the template's cached steps that are not among
// keys (the chain of the build that just succeeded).
func (s *Service) pruneStepCache(ctx context.Context, templateID string, keys []string) {
	keep := map[string]bool{}
	for _, k := range keys {
		keep[stepCacheName(templateID, k)] = true
	}
	all, err := s.node.ListTemplates(ctx)
	if err != nil {
		s.logger.WarnContext(ctx, "list cached build steps", "template", templateID, "err", err)
		return
	}
	for _, t := range all {
		if t.Kind == store.KindSnapshot && isStepCacheOf(t.Name, templateID) && !keep[t.Name] {
			s.dropTemplate(ctx, t.ID)
		}
	}
}

// Forget drops what builds of templateID left behind, once the template
// itself is deleted: its cached steps, its whole-build cache entry and
// its tags.
func (s *Service) Forget(ctx context.Context, templateID string) {
	s.mu.Lock()
	delete(s.done, templateID)
	s.mu.Unlock()
	s.pruneStepCache(ctx, templateID, nil)
	if err := s.forgetTags(templateID); err != nil {
		s.logger.Warn("template deleted but its tags remain", "template", templateID, "err", err)
	}
}
