package cli

import (
	"errors"
	"reflect"
	"testing"

	"github.com/aenv-dev/aenv/internal/client"
)

func TestParseVolumeMounts(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  []client.VolumeMount
		bad   bool
	}{
		{nil, nil, false},
		{[]string{"data:/mnt/data"}, []client.VolumeMount{{Name: "data", Path: "/mnt/data"}}, false},
		{[]string{"data:/mnt/data:ro", "vol-abc:/w:rw"},
			[]client.VolumeMount{{Name: "data", Path: "/mnt/data", ReadOnly: true}, {Name: "vol-abc", Path: "/w"}}, false},
		{[]string{"data"}, nil, true},
		{[]string{"data:mnt"}, nil, true},
		{[]string{":/mnt"}, nil, true},
		{[]string{"data:/mnt:rx"}, nil, true},
		{[]string{"data:/mnt:ro:x"}, nil, true},
	} {
		got, err := parseVolumeMounts(tc.flags)
		var usage usageError
		switch {
		case tc.bad && !errors.As(err, &usage):
			t.Errorf("%q: %v %v, want a usage error", tc.flags, got, err)
		case !tc.bad && (err != nil || !reflect.DeepEqual(got, tc.want)):
			t.Errorf("%q: %+v %v, want %+v", tc.flags, got, err, tc.want)
		}
	}
}

func TestVolumeRef(t *testing.T) {
	for _, tc := range []struct {
		arg, vol, path string
		ok             bool
	}{
		{"data:/a/b", "data", "/a/b", true},
		{"vol-abc:/", "vol-abc", "/", true},
		{"./data:/x", "", "", false}, // a local path with a colon
		{"data:a", "", "", false},
		{":/a", "", "", false},
		{"/tmp/file", "", "", false},
		{`C:\x`, "", "", false},
	} {
		vol, p, ok := volumeRef(tc.arg)
		if vol != tc.vol || p != tc.path || ok != tc.ok {
			t.Errorf("volumeRef(%q) = %q %q %v, want %q %q %v", tc.arg, vol, p, ok, tc.vol, tc.path, tc.ok)
		}
	}
}
