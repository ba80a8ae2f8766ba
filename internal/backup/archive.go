// Package backup archives a single node's data dir while its server runs,
// and restores such an archive into an empty data dir.
//
// An archive is a zstd-compressed tar stream:
//
//	aenv-backup.json        header: format, source data dir, external roots
//	data/aenv.db            a consistent copy of the database (VACUUM INTO)
//	data/<path>             the data dir's durable files
//	external/<n>/<path>     root filesystems the database refers to outside
//	                        the data dir (--template-cache-dir), root n of
//	                        the header's list
//	aenv-backup.end         trailer: how many entries and bytes came before
//
// A stream cut short or altered lacks its trailer, or fails zstd's
// checksum, or its counts: a restore refuses it before it writes anything
// into the data dir.
package backup

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"
)

// Entry names of the archive.
const (
	headerName  = "aenv-backup.json"
	trailerName = "aenv-backup.end"
	dataPrefix  = "data/"
	extPrefix   = "external/"
	formatV1    = 1
)

// Names in the data dir, as the server lays it out (internal/server).
const (
	dbName = "aenv.db"
)

// header opens an archive.
type header struct {
	Format int `json:"format"`
	// Version is the aenv that wrote it.
	Version string `json:"version"`
	// DataDir is the absolute path of the data dir backed up: the records
	// name files under it, rewritten on restore to the new data dir.
	DataDir string    `json:"dataDir"`
	Created time.Time `json:"created"`
	// External are root filesystems outside the data dir that records
	// refer to (absolute paths), restored where they are missing.
	External []string `json:"external,omitempty"`
}

// trailer closes an archive; its counts cover every entry before it,
// the header included.
type trailer struct {
	Entries int   `json:"entries"`
	Bytes   int64 `json:"bytes"`
}

func encodeJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // the types above always marshal
	}
	return b
}

// cleanName checks that an entry name is a relative path that stays under
// its root: no absolute path, no "..", nothing unclean.
func cleanName(name string) error {
	if name == "" || strings.HasPrefix(name, "/") || path.Clean(name) != name || name == "." ||
		name == ".." || strings.HasPrefix(name, "../") {
		return fmt.Errorf("entry %q is not a clean relative path", name)
	}
	return nil
}
