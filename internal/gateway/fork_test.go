package gateway

import (
	"encoding/json"
	"testing"

	"github.com/aenv-dev/aenv/internal/store"
)

// A fork of a snapshot with volumes spreads over nodes only when it copies
// every volume the snapshot mounts (paths compared cleaned).
func TestCopiesOf(t *testing.T) {
	tpl := &store.Template{NodeID: "node-a", VolumeMounts: []store.VolumeMount{
		{Path: "/ws", VolumeID: "v1", Name: "ws"}, {Path: "/data", VolumeID: "v2", Name: "data"}}}
	for _, tc := range []struct {
		body string
		want bool
	}{
		{`{"count":4}`, false},
		{`{"count":4,"volumes":{"/ws":"copy"}}`, false},
		{`{"count":4,"volumes":{"/ws":"copy","/data":"shared"}}`, false},
		{`{"count":4,"volumes":{"/ws":"copy","/data":"copy"}}`, true},
		{`{"count":4,"volumes":{"/ws/":"copy","//data":"copy"}}`, true},
		{`{"count":4,"volumes":{"/ws":"copy","/data":"copy","/other":"copy"}}`, false}, // the node refuses it
		{`{"count":4,"volumes":"copy"}`, false},
	} {
		var req map[string]json.RawMessage
		if err := json.Unmarshal([]byte(tc.body), &req); err != nil {
			t.Fatal(err)
		}
		got := copiesOf(req, tpl)
		if (got != nil) != tc.want {
			t.Errorf("%s: plan %+v, want one: %v", tc.body, got, tc.want)
		}
		if got != nil && (got.origin != "node-a" || len(got.mounts) != 2) {
			t.Errorf("%s: plan %+v", tc.body, got)
		}
	}
}
