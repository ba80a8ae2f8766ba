package envd

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/aenv-dev/aenv/api/envd/filesystem"
)

func TestStatEntryInfo(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "f.txt")
	if err := os.WriteFile(file, []byte("hello"), 0o640); err != nil {
		t.Fatal(err)
	}
	os.Chmod(file, 0o640)
	if err := os.Symlink(file, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	me, _ := env.srv.userByName("")

	// Raw JSON: the wire shape the SDK parses.
	status, _, body := doRaw(t, "POST", env.ts.URL+"/filesystem.Filesystem/Stat", `{"path":"`+file+`"}`,
		map[string]string{"Content-Type": "application/json"})
	if status != 200 {
		t.Fatalf("stat: %d %s", status, body)
	}
	mustContain(t, body, `"size":"5"`, `"mode":416`, `"permissions":"-rw-r-----"`, `"type":"FILE_TYPE_FILE"`,
		`"name":"f.txt"`, `"path":"`+file+`"`, `"owner":"`+me.Name+`"`, `"modifiedTime":"`)

	tests := []struct {
		path       string
		wantType   fspb.FileType
		wantTarget string
		wantCode   connect.Code
	}{
		{path: file, wantType: fspb.FileType_FILE_TYPE_FILE},
		{path: dir, wantType: fspb.FileType_FILE_TYPE_DIRECTORY},
		{path: filepath.Join(dir, "link"), wantType: fspb.FileType_FILE_TYPE_FILE, wantTarget: file},
		{path: filepath.Join(dir, "missing"), wantCode: connect.CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.path), func(t *testing.T) {
			resp, err := env.fs.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: tt.path}))
			if tt.wantCode != 0 {
				if connect.CodeOf(err) != tt.wantCode {
					t.Fatalf("err %v, want %v", err, tt.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			e := resp.Msg.GetEntry()
			if e.GetType() != tt.wantType || e.GetSymlinkTarget() != tt.wantTarget {
				t.Fatalf("entry %v", e)
			}
		})
	}
}

func TestListDirDepth(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	for _, p := range []string{"a/b/c", "d"} {
		os.MkdirAll(filepath.Join(dir, p), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "a/f"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "a/b/c/deep"), nil, 0o644)
	tests := []struct {
		depth uint32
		want  []string
	}{
		{0, []string{"a", "d"}},
		{1, []string{"a", "d"}},
		{2, []string{"a", "a/b", "a/f", "d"}},
		{4, []string{"a", "a/b", "a/b/c", "a/b/c/deep", "a/f", "d"}},
	}
	for _, tt := range tests {
		resp, err := env.fs.ListDir(context.Background(), connect.NewRequest(&fspb.ListDirRequest{Path: dir, Depth: tt.depth}))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range resp.Msg.GetEntries() {
			rel, _ := filepath.Rel(dir, e.GetPath())
			got = append(got, rel)
		}
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Fatalf("depth %d: %v, want %v", tt.depth, got, tt.want)
		}
	}
	_, err := env.fs.ListDir(context.Background(), connect.NewRequest(&fspb.ListDirRequest{Path: filepath.Join(dir, "a/f")}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("list a file: %v", err)
	}
	_, err = env.fs.ListDir(context.Background(), connect.NewRequest(&fspb.ListDirRequest{Path: filepath.Join(dir, "zz")}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("list missing: %v", err)
	}
}

func TestMakeDirMoveRemove(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	ctx := context.Background()
	made, err := env.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: filepath.Join(dir, "x/y")}))
	if err != nil || made.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_DIRECTORY {
		t.Fatalf("mkdir: %v %v", made, err)
	}
	_, err = env.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: filepath.Join(dir, "x/y")}))
	if connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("mkdir again: %v", err)
	}
	moved, err := env.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: filepath.Join(dir, "x/y"), Destination: filepath.Join(dir, "n/z")}))
	if err != nil || moved.Msg.GetEntry().GetPath() != filepath.Join(dir, "n/z") {
		t.Fatalf("move: %v %v", moved, err)
	}
	_, err = env.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: filepath.Join(dir, "gone"), Destination: filepath.Join(dir, "q")}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("move missing: %v", err)
	}
	for _, p := range []string{filepath.Join(dir, "n"), filepath.Join(dir, "never-existed")} {
		if _, err := env.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: p})); err != nil {
			t.Fatalf("remove %s: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "n")); !os.IsNotExist(err) {
		t.Fatalf("n still there: %v", err)
	}
}

func TestWatchDir(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := env.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: dir, Recursive: true, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first frame is not start: %v %v", stream.Msg(), stream.Err())
	}
	os.WriteFile(filepath.Join(dir, "new.txt"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "sub/inner.txt"), []byte("y"), 0o644)
	os.Remove(filepath.Join(dir, "new.txt"))
	want := map[string]bool{
		"EVENT_TYPE_CREATE new.txt":       false,
		"EVENT_TYPE_WRITE new.txt":        false,
		"EVENT_TYPE_REMOVE new.txt":       false,
		"EVENT_TYPE_CREATE sub/inner.txt": false,
	}
	remaining := len(want)
	for remaining > 0 && stream.Receive() {
		fe := stream.Msg().GetFilesystem()
		if fe == nil {
			continue
		}
		key := fe.GetType().String() + " " + fe.GetName()
		if done, ok := want[key]; ok && !done {
			want[key] = true
			remaining--
		}
		if fe.GetType() == fspb.EventType_EVENT_TYPE_CREATE && fe.GetName() == "sub/inner.txt" && fe.GetEntry().GetSize() > 1 {
			t.Fatalf("entry for create: %v", fe.GetEntry())
		}
	}
	if remaining > 0 {
		t.Fatalf("missing events: %v (err %v)", want, stream.Err())
	}

	missing, err := env.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: filepath.Join(dir, "nope")}))
	if err != nil {
		t.Fatal(err)
	}
	defer missing.Close()
	if missing.Receive() || connect.CodeOf(missing.Err()) != connect.CodeNotFound {
		t.Fatalf("watch missing: %v", err)
	}
}

// TestWatchDirWire checks the raw start frame and the end-stream frame when
// the deadline passes.
func TestWatchDirWire(t *testing.T) {
	env := newTestEnv(t)
	resp := rawStream(t, context.Background(), env.ts.URL+"/filesystem.Filesystem/WatchDir", `{"path":"`+t.TempDir()+`"}`,
		map[string]string{"Connect-Timeout-Ms": "300"})
	frames := readAllFrames(t, resp.Body, 5*time.Second)
	if len(frames) != 2 || string(frames[0].data) != `{"start":{}}` || frames[1].flags != 2 {
		t.Fatalf("frames %q", frames)
	}
}

func TestWatcherTrio(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	ctx := context.Background()
	created, err := env.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: dir}))
	if err != nil {
		t.Fatal(err)
	}
	id := created.Msg.GetWatcherId()
	os.WriteFile(filepath.Join(dir, "p"), nil, 0o644)
	var names []string
	for deadline := time.Now().Add(5 * time.Second); len(names) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got, err := env.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range got.Msg.GetEvents() {
			names = append(names, e.GetName())
		}
	}
	if len(names) == 0 || names[0] != "p" {
		t.Fatalf("events %v", names)
	}
	if _, err := env.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = env.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("after remove: %v", err)
	}
}

func TestMetricsShape(t *testing.T) {
	env := newTestEnv(t)
	status, _, body := doRaw(t, "GET", env.ts.URL+"/metrics", "", nil)
	if status != 200 {
		t.Fatalf("metrics %d %s", status, body)
	}
	var m map[string]float64
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "mem_cache", "mem_total_mib", "mem_used_mib", "disk_used", "disk_total"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("metrics %s lacks %s", body, k)
		}
	}
	if m["mem_total"] <= 0 || m["cpu_count"] < 1 || m["disk_total"] <= 0 {
		t.Fatalf("metrics %s", body)
	}
}
