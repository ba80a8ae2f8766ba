package build

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
)

// emptyNode has no templates: Forget finds no cached steps to drop.
type emptyNode struct{ node.Node }

func (emptyNode) ListTemplates(context.Context) ([]*store.Template, error) { return nil, nil }

func tagService(t *testing.T, state string) *Service {
	t.Helper()
	uploads, err := NewUploads(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{}, emptyNode{}, uploads, state, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func tagNames(tags []Tag) []string {
	out := []string{}
	for _, t := range tags {
		out = append(out, t.Tag)
	}
	return out
}

func TestTags(t *testing.T) {
	state := t.TempDir()
	s := tagService(t, state)
	app := &store.Template{ID: "tpl-1", Name: "app"}
	other := &store.Template{ID: "tpl-2", Name: "other"}
	steps := []struct {
		name    string
		do      func() error
		tpl     string
		want    []string
		wantErr error
	}{
		{"assign two", func() error { _, err := s.AssignTags(app, []string{"v1", "prod"}); return err },
			"app", []string{"prod", "v1"}, nil},
		{"assign one more", func() error { _, err := s.AssignTags(app, []string{"stable"}); return err },
			"app", []string{"prod", "v1", "stable"}, nil},
		{"other template's tags are its own", func() error { _, err := s.AssignTags(other, []string{"x"}); return err },
			"app", []string{"prod", "v1", "stable"}, nil},
		{"no tags", func() error { _, err := s.AssignTags(app, nil); return err }, "app", nil, ErrInvalid},
		{"tag with a colon", func() error { _, err := s.AssignTags(app, []string{"a:b"}); return err }, "app", nil, ErrInvalid},
		{"tag with a slash", func() error { _, err := s.AssignTags(app, []string{"../x"}); return err }, "app", nil, ErrInvalid},
		{"empty tag", func() error { _, err := s.AssignTags(app, []string{""}); return err }, "app", nil, ErrInvalid},
		{"unnamed template", func() error {
			_, err := s.AssignTags(&store.Template{ID: "tpl-3", Name: "tpl-3"}, []string{"v1"})
			return err
		}, "tpl-3", []string{}, ErrInvalid},
		{"remove one and an absent one", func() error { return s.RemoveTags("app", []string{"v1", "never"}) },
			"app", []string{"prod", "stable"}, nil},
		{"remove a bad tag", func() error { return s.RemoveTags("app", []string{"a/b"}) }, "app", nil, ErrInvalid},
		{"remove all", func() error { return s.RemoveTags("app", []string{"prod", "stable"}) },
			"app", []string{}, nil},
		{"again after removing all", func() error { _, err := s.AssignTags(app, []string{"v2"}); return err },
			"app", []string{"v2"}, nil},
	}
	for _, st := range steps {
		err := st.do()
		if !errors.Is(err, st.wantErr) || (st.wantErr == nil) != (err == nil) {
			t.Fatalf("%s: error %v, want %v", st.name, err, st.wantErr)
		}
		if st.want == nil {
			continue
		}
		tags, err := s.Tags(st.tpl)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got := tagNames(tags)
		// Tags assigned together share a time: compare as sets.
		if !sameSet(got, st.want) {
			t.Fatalf("%s: tags %v, want %v", st.name, got, st.want)
		}
	}

	// The tags survive a restart; deleting the template forgets them.
	s.Close()
	s2 := tagService(t, state)
	if tags, _ := s2.Tags("other"); !reflect.DeepEqual(tagNames(tags), []string{"x"}) {
		t.Fatalf("after a restart: %v", tags)
	}
	s2.Forget(context.Background(), "other")
	if tags, err := s2.Tags("other"); err != nil || len(tags) != 0 {
		t.Fatalf("after Forget: %v %v", tags, err)
	}
	if tags, _ := s2.Tags("app"); !reflect.DeepEqual(tagNames(tags), []string{"v2"}) {
		t.Fatalf("Forget took another template's tags: %v", tags)
	}
	// No temporary files are left beside the tag files.
	entries, _ := os.ReadDir(filepath.Join(state, tagsDir))
	if len(entries) != 1 || entries[0].Name() != "app.tags.json" {
		t.Fatalf("tag files: %v", entries)
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]int{}
	for _, x := range a {
		seen[x]++
	}
	for _, x := range b {
		seen[x]--
	}
	for _, n := range seen {
		if n != 0 {
			return false
		}
	}
	return true
}

// A tag names the build that made the template's version when the service
// ran it, else an ID derived from the version that holds across restarts
// and changes with the version.
func TestTagBuildID(t *testing.T) {
	s := tagService(t, t.TempDir())
	v1 := &store.Template{ID: "tpl-1", Name: "app"}
	v2 := &store.Template{ID: "tpl-2", Name: "app"}
	derived, err := s.AssignTags(v1, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	again, _ := tagService(t, t.TempDir()).AssignTags(v1, []string{"a"})
	other, _ := s.AssignTags(v2, []string{"a"})
	if derived != again || derived == other || len(derived) != 36 {
		t.Fatalf("derived IDs: %q, %q again, %q for another version", derived, again, other)
	}
	s.mu.Lock()
	s.done["app"] = cached{key: "k", templateID: "tpl-2", buildID: "b-2"}
	s.mu.Unlock()
	for _, tc := range []struct {
		tpl  *store.Template
		want string
	}{{v2, "b-2"}, {v1, derived}} {
		id, err := s.AssignTags(tc.tpl, []string{"b"})
		if err != nil || id != tc.want {
			t.Errorf("version %s: build ID %q (%v), want %q", tc.tpl.ID, id, err, tc.want)
		}
		tags, _ := s.Tags("app")
		for _, tag := range tags {
			if tag.Tag == "b" && (tag.BuildID != tc.want || tag.CreatedAt.IsZero()) {
				t.Errorf("version %s: recorded %+v", tc.tpl.ID, tag)
			}
		}
	}
}
