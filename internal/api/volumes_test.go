package api

import (
	"net/http/httptest"
	"testing"

	"github.com/aenv-dev/aenv/internal/volume"
)

func TestContentOptions(t *testing.T) {
	for _, tc := range []struct {
		query            string
		uid, gid, mode   int64 // -1: not given
		force, malformed bool
	}{
		{query: "", uid: -1, gid: -1, mode: -1},
		{query: "uid=1000&gid=1001&mode=420&force=true", uid: 1000, gid: 1001, mode: 0o644, force: true},
		{query: "uid=&mode=", uid: -1, gid: -1, mode: -1}, // empty is not given (the SDK sends undefined)
		{query: "uid=-1", malformed: true},
		{query: "uid=4294967296", malformed: true},
		{query: "mode=65535", malformed: true}, // more than permission bits
		{query: "force=maybe", malformed: true},
	} {
		o, err := contentOptions(httptest.NewRequest("GET", "/volumecontent/v/file?path=/x&"+tc.query, nil))
		if tc.malformed {
			if status, _ := statusOf(err); err == nil || status != 400 {
				t.Errorf("%q: %v, want a 400", tc.query, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.query, err)
			continue
		}
		for _, f := range []struct {
			name string
			got  *uint32
			want int64
		}{{"uid", o.UID, tc.uid}, {"gid", o.GID, tc.gid}, {"mode", o.Mode, tc.mode}} {
			if (f.got == nil) != (f.want < 0) || (f.got != nil && int64(*f.got) != f.want) {
				t.Errorf("%q: %s = %v, want %d", tc.query, f.name, f.got, f.want)
			}
		}
		if o.Force != tc.force {
			t.Errorf("%q: force %v", tc.query, o.Force)
		}
	}
}

// The content API's errors keep their meaning on the wire: a missing path
// is 404 (the SDK's VolumePathNotFoundError), a full volume 507.
func TestContentErrorStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{volume.ErrNotFound, 404},
		{volume.ErrExists, 409},
		{volume.ErrIsDir, 400},
		{volume.ErrInvalid, 400},
		{volume.ErrNotRegular, 400},
		{volume.ErrNoSpace, 507},
		{volume.ErrTooMany, 400},
	} {
		if got, _ := statusOf(contentError(tc.err)); got != tc.want {
			t.Errorf("%v: status %d, want %d", tc.err, got, tc.want)
		}
	}
}
