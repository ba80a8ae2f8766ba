package server

import (
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/objectstore"
	"github.com/aenv-dev/aenv/internal/runtime/gvisor/ckptgofer"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// One node of a cluster collects the object store's garbage: the first by
// ID of those that can (live, sharing images, this protocol).
func TestCollector(t *testing.T) {
	const silent = 5 * time.Second
	live := func(id string) postgres.Node {
		return postgres.Node{ID: id, SharedImages: true, Protocol: cluster.Protocol, HeartbeatAge: time.Second}
	}
	silentNode, noShared, older, newer := live("a"), live("a"), live("a"), live("z")
	silentNode.HeartbeatAge = time.Minute
	noShared.SharedImages = false
	older.Protocol = cluster.Protocol - 1
	newer.Protocol = cluster.Protocol + 1
	for _, tc := range []struct {
		name  string
		nodes []postgres.Node
		self  string
		want  string
	}{
		{"the first by ID", []postgres.Node{live("a"), live("b"), live("c")}, "b", "a"},
		{"self first", []postgres.Node{live("a"), live("b")}, "a", "a"},
		{"a silent node does not", []postgres.Node{silentNode, live("b"), live("c")}, "c", "b"},
		{"a node without the store does not", []postgres.Node{noShared, live("b")}, "b", "b"},
		{"an older release does not", []postgres.Node{older, live("b")}, "b", "b"},
		{"a newer release does, whatever its ID", []postgres.Node{live("a"), live("b"), newer}, "a", "z"},
		{"none listed yet: self", nil, "z", "z"},
		{"none able: self", []postgres.Node{silentNode}, "z", "z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := collector(tc.nodes, silent, tc.self); got != tc.want {
				t.Errorf("collector = %q, want %q", got, tc.want)
			}
		})
	}
}

// The gofer looks for the memory file under the name the lazy fetch gives
// it until it is complete.
func TestLazyFileNames(t *testing.T) {
	if ckptgofer.PartialSuffix != objectstore.PartialSuffix {
		t.Fatalf("the gofer reads %q, the fetch writes %q", ckptgofer.PagesFile+ckptgofer.PartialSuffix, ckptgofer.PagesFile+objectstore.PartialSuffix)
	}
	if got := (feedStreamer{}).File(); got != ckptgofer.PagesFile {
		t.Fatalf("the streamer hands over %q, the gofer waits on %q", got, ckptgofer.PagesFile)
	}
}
