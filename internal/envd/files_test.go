package envd

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"maps"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// multipartBody builds the SDK's upload: parts named "file" whose filename
// is the full target path.
func multipartBody(t *testing.T, files map[string]string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for name, content := range files {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+name+`"`)
		h.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, content)
	}
	mw.Close()
	return mw.FormDataContentType(), &buf
}

func postFiles(t *testing.T, env *testEnv, query url.Values, contentType string, body io.Reader, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, env.ts.URL+"/files?"+query.Encode(), body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func TestPostFilesMultipart(t *testing.T) {
	env := newTestEnv(t)
	me, _ := env.srv.userByName("")
	dir := t.TempDir()
	// writeFiles: no path query, directories in each filename.
	ct, body := multipartBody(t, map[string]string{
		filepath.Join(dir, "a/b/one.txt"): "one",
		filepath.Join(dir, "two.txt"):     "two",
	})
	status, resp := postFiles(t, env, url.Values{}, ct, body, nil)
	if status != 200 {
		t.Fatalf("status %d %s", status, resp)
	}
	var entries []fileEntry
	if err := json.Unmarshal([]byte(resp), &entries); err != nil || len(entries) != 2 {
		t.Fatalf("response %q: %v", resp, err)
	}
	for name, want := range map[string]string{"a/b/one.txt": "one", "two.txt": "two"} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != want {
			t.Fatalf("%s = %q, %v", name, got, err)
		}
	}
	if entries[0].Type != "file" || !strings.HasPrefix(entries[0].Path, dir) || entries[0].Name != filepath.Base(entries[0].Path) {
		t.Fatalf("entry %+v", entries[0])
	}

	tests := []struct {
		name       string
		query      url.Values
		files      map[string]string
		wantStatus int
		wantPath   string
	}{
		{"path query wins", url.Values{"path": {filepath.Join(dir, "q.txt")}}, map[string]string{"ignored": "q"}, 200, filepath.Join(dir, "q.txt")},
		{"relative filename resolves to home", url.Values{}, map[string]string{"aenv-test-rel/x.txt": "x"}, 200, filepath.Join(me.Home, "aenv-test-rel/x.txt")},
		{"traversal is cleaned", url.Values{}, map[string]string{dir + "/a/../../" + filepath.Base(dir) + "/t.txt": "t"}, 200, filepath.Join(dir, "t.txt")},
		{"directory target", url.Values{"path": {filepath.Join(dir, "a")}}, map[string]string{"a": "x"}, 400, ""},
		{"no file part", url.Values{}, map[string]string{}, 400, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ct, body := multipartBody(t, tt.files)
			status, resp := postFiles(t, env, tt.query, ct, body, nil)
			if status != tt.wantStatus {
				t.Fatalf("status %d %s, want %d", status, resp, tt.wantStatus)
			}
			if tt.wantPath == "" {
				return
			}
			if !strings.Contains(resp, `"path":"`+tt.wantPath+`"`) {
				t.Fatalf("response %s does not name %s", resp, tt.wantPath)
			}
			if _, err := os.Stat(tt.wantPath); err != nil {
				t.Fatal(err)
			}
		})
	}

	// A duplicate path within one request is refused.
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for range 2 {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+filepath.Join(dir, "dup")+`"`)
		w, _ := mw.CreatePart(h)
		io.WriteString(w, "d")
	}
	mw.Close()
	if status, resp := postFiles(t, env, url.Values{}, mw.FormDataContentType(), &buf, nil); status != 400 {
		t.Fatalf("duplicate: %d %s", status, resp)
	}
}

func TestPostFilesOctetStream(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("compressed"))
	zw.Close()
	tests := []struct {
		name       string
		path       string
		body       []byte
		header     map[string]string
		want       string
		wantStatus int
	}{
		{"plain", filepath.Join(dir, "plain"), []byte("raw"), nil, "raw", 200},
		{"gzip", filepath.Join(dir, "gz"), gz.Bytes(), map[string]string{"Content-Encoding": "gzip"}, "compressed", 200},
		{"empty", filepath.Join(dir, "empty"), nil, nil, "", 200},
		{"missing path", "", []byte("x"), nil, "", 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := url.Values{}
			if tt.path != "" {
				q.Set("path", tt.path)
			}
			status, resp := postFiles(t, env, q, "application/octet-stream", bytes.NewReader(tt.body), tt.header)
			if status != tt.wantStatus {
				t.Fatalf("status %d %s", status, resp)
			}
			if status != 200 {
				return
			}
			got, err := os.ReadFile(tt.path)
			if err != nil || string(got) != tt.want {
				t.Fatalf("content %q %v", got, err)
			}
		})
	}
}

// TestFilesMetadata follows upstream: X-Metadata-* live under user.e2b.
// xattrs, other user.* xattrs are not metadata, each write replaces the
// file's metadata (none clears it), and what cannot be stored is a 400.
func TestFilesMetadata(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	if err := syscall.Setxattr(dir, "user.probe", []byte("1"), 0); err != nil {
		t.Skipf("no user xattrs on %s: %v", dir, err)
	}
	path := filepath.Join(dir, "m.txt")
	write := func(t *testing.T, header map[string]string) (int, string) {
		t.Helper()
		return postFiles(t, env, url.Values{"path": {path}}, "application/octet-stream", strings.NewReader("m"), header)
	}
	steps := []struct {
		name       string
		header     map[string]string
		foreign    bool // set user.other before checking
		wantStatus int
		want       map[string]string
	}{
		{"stored", map[string]string{"X-Metadata-Owner-Team": "RL", "X-Metadata-Run": "7"}, false, 200, map[string]string{"owner-team": "RL", "run": "7"}},
		{"other user xattrs are not metadata", map[string]string{"X-Metadata-Run": "7"}, true, 200, map[string]string{"run": "7"}},
		{"overwrite replaces", map[string]string{"X-Metadata-Run": "8"}, false, 200, map[string]string{"run": "8"}},
		{"overwrite without metadata clears", nil, false, 200, nil},
		{"non-printable value", map[string]string{"X-Metadata-Bad": "a\tb"}, false, 400, nil},
		{"key too long", map[string]string{"X-Metadata-" + strings.Repeat("k", 250): "v"}, false, 400, nil},
		{"too much in total", map[string]string{"X-Metadata-A": strings.Repeat("a", 2100), "X-Metadata-B": strings.Repeat("b", 2100)}, false, 400, nil},
	}
	for _, tt := range steps {
		t.Run(tt.name, func(t *testing.T) {
			if tt.foreign {
				if err := syscall.Setxattr(path, "user.other", []byte("x"), 0); err != nil {
					t.Fatal(err)
				}
			}
			status, resp := write(t, tt.header)
			if status != tt.wantStatus {
				t.Fatalf("status %d %s, want %d", status, resp, tt.wantStatus)
			}
			if status != 200 {
				return
			}
			var entries []fileEntry
			if err := json.Unmarshal([]byte(resp), &entries); err != nil || len(entries) != 1 {
				t.Fatalf("response %s: %v", resp, err)
			}
			entry, err := env.srv.entryInfo(path)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(entries[0].Metadata, tt.want) || !maps.Equal(entry.Metadata, tt.want) {
				t.Fatalf("metadata: written %v, stat %v, want %v", entries[0].Metadata, entry.Metadata, tt.want)
			}
			for k, v := range tt.want {
				buf := make([]byte, 64)
				n, err := syscall.Getxattr(path, "user.e2b."+k, buf)
				if err != nil || string(buf[:n]) != v {
					t.Fatalf("xattr user.e2b.%s = %q, %v; want %q", k, buf[:n], err, v)
				}
			}
		})
	}
	// Attributes other tools set are theirs: a write leaves them alone.
	buf := make([]byte, 8)
	if n, err := syscall.Getxattr(path, "user.other", buf); err != nil || string(buf[:n]) != "x" {
		t.Fatalf("user.other = %q, %v", buf[:n], err)
	}
}

func TestGetFiles(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "full"), []byte("hello world"), 0o644)
	os.WriteFile(filepath.Join(dir, "empty"), nil, 0o644)
	// procfs reports size 0 for this file (gVisor's also refuses to seek
	// it); its content is only known by reading it.
	const bootID = "/proc/sys/kernel/random/boot_id"
	wantBootID, err := os.ReadFile(bootID)
	if err != nil || len(wantBootID) == 0 {
		t.Fatalf("read %s on the host: %v", bootID, err)
	}
	identity := map[string]string{"Accept-Encoding": "identity"}
	gzipped := map[string]string{"Accept-Encoding": "gzip, deflate"}
	tests := []struct {
		name       string
		query      url.Values
		header     map[string]string
		wantStatus int
		wantBody   string
		wantLength string // "" = not checked (net/http may add one)
		wantGzip   bool
	}{
		{"content", url.Values{"path": {filepath.Join(dir, "full")}}, identity, 200, "hello world", "11", false},
		{"no accept-encoding", url.Values{"path": {filepath.Join(dir, "full")}}, nil, 200, "hello world", "11", false},
		{"empty has length 0", url.Values{"path": {filepath.Join(dir, "empty")}}, identity, 200, "", "0", false},
		{"gzip when asked", url.Values{"path": {filepath.Join(dir, "full")}}, gzipped, 200, "hello world", "", true},
		{"gzip refused by quality", url.Values{"path": {filepath.Join(dir, "full")}}, map[string]string{"Accept-Encoding": "gzip;q=0, identity"}, 200, "hello world", "11", false},
		{"range stays identity", url.Values{"path": {filepath.Join(dir, "full")}}, map[string]string{"Accept-Encoding": "gzip", "Range": "bytes=6-"}, 206, "world", "5", false},
		{"procfs file streams", url.Values{"path": {bootID}}, identity, 200, string(wantBootID), "", false},
		{"procfs file gzipped", url.Values{"path": {bootID}}, gzipped, 200, string(wantBootID), "", true},
		// A device seeks to 0: its answer is empty with or without gzip,
		// never an endless stream.
		{"device", url.Values{"path": {"/dev/zero"}}, identity, 200, "", "0", false},
		{"device gzipped", url.Values{"path": {"/dev/zero"}}, gzipped, 200, "", "", true},
		// Nothing of it can be read (offset 0 is not mapped): a clear 400,
		// not an empty 200.
		{"unreadable procfs file", url.Values{"path": {"/proc/self/mem"}}, identity, 400, "", "", false},
		{"missing", url.Values{"path": {filepath.Join(dir, "nope")}}, nil, 404, "", "", false},
		{"directory", url.Values{"path": {dir}}, nil, 400, "", "", false},
		{"unknown user", url.Values{"path": {filepath.Join(dir, "full")}, "username": {"no-such-user-x"}}, nil, 401, "", "", false},
		{"no path", url.Values{}, nil, 400, "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, env.ts.URL+"/files?"+tt.query.Encode(), nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			// Without DisableCompression Go's transport would ask for gzip
			// by itself and undo it out of sight.
			resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d %s", resp.StatusCode, body)
			}
			if tt.wantStatus >= 300 {
				var e struct{ Code int }
				if json.Unmarshal(body, &e) != nil || e.Code != tt.wantStatus {
					t.Fatalf("error body %q", body)
				}
				return
			}
			if isGzip := resp.Header.Get("Content-Encoding") == "gzip"; isGzip != tt.wantGzip {
				t.Fatalf("Content-Encoding %q, want gzip %v", resp.Header.Get("Content-Encoding"), tt.wantGzip)
			}
			if length := resp.Header.Get("Content-Length"); tt.wantLength != "" && length != tt.wantLength {
				t.Fatalf("Content-Length %q, want %q", length, tt.wantLength)
			}
			if tt.wantGzip {
				zr, err := gzip.NewReader(bytes.NewReader(body))
				if err != nil {
					t.Fatalf("gzip body: %v", err)
				}
				if body, err = io.ReadAll(zr); err != nil {
					t.Fatalf("gzip body: %v", err)
				}
			}
			if string(body) != tt.wantBody {
				t.Fatalf("body %q, want %q", body, tt.wantBody)
			}
		})
	}
}

func TestAcceptsGzip(t *testing.T) {
	tests := []struct {
		header string
		want   bool
	}{
		{"", false},
		{"gzip", true},
		{"gzip, deflate, br", true},
		{"GZIP;q=0.5", true},
		{"gzip;q=0", false},
		{"identity", false},
		{"br", false},
		{"gzip;q=0.5, identity", false},
		{"identity;q=0.2, gzip;q=0.8", true},
		{"*", false},
		{"*, identity;q=0", true},
		{"deflate;q=0.9, *;q=0.1", false},
	}
	for _, tt := range tests {
		if got := acceptsGzip(tt.header); got != tt.want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", tt.header, got, tt.want)
		}
	}
}

// TestFilesOwnership writes as a second user: the file and the parents it
// needed belong to that user, and relative paths land in its home.
func TestFilesOwnership(t *testing.T) {
	env := newTestEnv(t)
	u, _ := env.addUser(t)
	name := u.Name
	status, resp := postFiles(t, env, url.Values{"path": {"deep/dir/f.txt"}, "username": {name}}, "application/octet-stream", strings.NewReader("u"), nil)
	if status != 200 {
		t.Fatalf("status %d %s", status, resp)
	}
	for _, p := range []string{"deep", "deep/dir", "deep/dir/f.txt"} {
		info, err := os.Stat(filepath.Join(u.Home, p))
		if err != nil {
			t.Fatal(err)
		}
		st := info.Sys().(*syscall.Stat_t)
		if st.Uid != u.UID || st.Gid != u.GID {
			t.Fatalf("%s owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, u.UID, u.GID)
		}
	}
	resp2, err := http.Get(env.ts.URL + "/files?" + url.Values{"path": {"deep/dir/f.txt"}, "username": {name}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	if body, _ := io.ReadAll(resp2.Body); string(body) != "u" {
		t.Fatalf("read back %q", body)
	}
}
