package build

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/atomicfile"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// Template tags (E2B's POST/DELETE /templates/tags and GET
// /templates/{templateID}/tags). aenv keeps one version of a template, so
// every tag names that version; the tags are a record of which names were
// given, kept per template in a JSON file under the state dir so that they
// survive a restart. Deleting the template (Forget) drops them.

const (
	// maxTags bounds the tags of one template, and of one request.
	maxTags = 100
	// tagsDir is the subdirectory of the state dir holding the tag files.
	tagsDir = "tags"
)

// Tag is one tag of a template (E2B's TemplateTag).
type Tag struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// CheckTag validates a tag: a template name without colons, since a colon
// separates the tag in "name:tag".
func CheckTag(tag string) error {
	if strings.Contains(tag, ":") {
		return fmt.Errorf("tag %q must not contain a colon", tag)
	}
	if err := template.CheckName(tag); err != nil {
		return fmt.Errorf("tag: %w", err)
	}
	return nil
}

// checkTags validates the tags of one request.
func checkTags(tags []string) error {
	if len(tags) == 0 {
		return errors.New("tags must name at least one tag")
	}
	if len(tags) > maxTags {
		return fmt.Errorf("at most %d tags at once", maxTags)
	}
	for _, t := range tags {
		if err := CheckTag(t); err != nil {
			return err
		}
	}
	return nil
}

// AssignTags records tags for tpl's version and returns the build ID they
// name: that of the build that made the version when this service ran it,
// else one derived from the version. A tag given again moves to now.
func (s *Service) AssignTags(tpl *store.Template, tags []string) (string, error) {
	if err := checkTags(tags); err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if !tpl.Named() {
		return "", fmt.Errorf("%w: only named templates take tags", ErrInvalid)
	}
	buildID := s.versionBuildID(tpl)
	now := time.Now().UTC()
	s.tagsMu.Lock()
	defer s.tagsMu.Unlock()
	have, err := s.readTags(tpl.Name)
	if err != nil {
		return "", err
	}
	byTag := make(map[string]Tag, len(have)+len(tags))
	for _, t := range have {
		byTag[t.Tag] = t
	}
	for _, t := range tags {
		byTag[t] = Tag{Tag: t, BuildID: buildID, CreatedAt: now}
	}
	if len(byTag) > maxTags {
		return "", fmt.Errorf("%w: a template takes at most %d tags", ErrInvalid, maxTags)
	}
	if err := s.writeTags(tpl.Name, byTag); err != nil {
		return "", err
	}
	return buildID, nil
}

// RemoveTags drops tags of the template name; tags it does not have are
// ignored, as the outcome is the same.
func (s *Service) RemoveTags(name string, tags []string) error {
	if err := checkTags(tags); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	s.tagsMu.Lock()
	defer s.tagsMu.Unlock()
	have, err := s.readTags(name)
	if err != nil {
		return err
	}
	byTag := make(map[string]Tag, len(have))
	for _, t := range have {
		byTag[t.Tag] = t
	}
	for _, t := range tags {
		delete(byTag, t)
	}
	if len(byTag) == len(have) {
		return nil
	}
	return s.writeTags(name, byTag)
}

// Tags lists the tags of the template name, oldest first.
func (s *Service) Tags(name string) ([]Tag, error) {
	s.tagsMu.Lock()
	defer s.tagsMu.Unlock()
	return s.readTags(name)
}

// forgetTags drops every tag of the template name.
func (s *Service) forgetTags(name string) error {
	s.tagsMu.Lock()
	defer s.tagsMu.Unlock()
	if err := os.Remove(s.tagsFile(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("forget tags of %s: %w", name, err)
	}
	return nil
}

// versionBuildID is the build ID of tpl's version: that of the build that
// made it if this service remembers it, else a UUID-shaped hash of the
// version's ID, so that it stays the same across restarts and changes with
// every new version.
func (s *Service) versionBuildID(tpl *store.Template) string {
	s.mu.Lock()
	c, ok := s.done[tpl.Name]
	s.mu.Unlock()
	if ok && c.templateID == tpl.ID && c.buildID != "" {
		return c.buildID
	}
	sum := sha256.Sum256([]byte("aenv-template-version:" + tpl.ID))
	return uuidShape(hex.EncodeToString(sum[:16]))
}

// tagsFile is where the tags of the template name are kept. Names are
// letters, digits and "._-:"; the suffix keeps "." and ".." plain files.
func (s *Service) tagsFile(name string) string {
	return filepath.Join(s.stateDir, tagsDir, name+".tags.json")
}

// readTags loads the tags of name (none when it has no file); tagsMu must
// be held.
func (s *Service) readTags(name string) ([]Tag, error) {
	data, err := os.ReadFile(s.tagsFile(name))
	if errors.Is(err, os.ErrNotExist) {
		return []Tag{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read tags of %s: %w", name, err)
	}
	var tags []Tag
	if err := json.Unmarshal(data, &tags); err != nil {
		return nil, fmt.Errorf("read tags of %s: %w", name, err)
	}
	return tags, nil
}

// writeTags replaces the tags of name, atomically: a reader sees either
// the old file or the new one. No tags remove the file. tagsMu must be
// held.
func (s *Service) writeTags(name string, byTag map[string]Tag) error {
	path := s.tagsFile(name)
	if len(byTag) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("write tags of %s: %w", name, err)
		}
		return nil
	}
	tags := make([]Tag, 0, len(byTag))
	for _, t := range byTag {
		tags = append(tags, t)
	}
	sort.Slice(tags, func(i, j int) bool {
		if !tags[i].CreatedAt.Equal(tags[j].CreatedAt) {
			return tags[i].CreatedAt.Before(tags[j].CreatedAt)
		}
		return tags[i].Tag < tags[j].Tag
	})
	data, err := json.Marshal(tags)
	if err != nil {
		return fmt.Errorf("write tags of %s: %w", name, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write tags of %s: %w", name, err)
	}
	if err := atomicfile.WriteDurable(path, bytes.NewReader(data), 0o600); err != nil {
		return fmt.Errorf("write tags of %s: %w", name, err)
	}
	return nil
}
