package objectstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
)

// A pack's pages are compressed in frames of framePages slots each, every
// frame a zstd frame of its own, followed by a frame table and then the
// hash list:
//
//	frame 0 | frame 1 | ... | table | hashes
//
// The table is a zstd skippable frame (magic, length) holding tableTag and
// each frame's compressed size, so a reader that decodes the whole pack as
// one zstd stream (this code before frames, or any zstd tool) skips it.
//
// Why frames: a lazy restore waits on the pages a fault asks for. With the
// pack one frame, a fault cost its whole pack (8 MiB) downloaded and
// decoded; with frames, a ranged GET of the pack's tail (its table and
// hashes, ~70 KiB, once per pack) and one of the frames holding the pages
// (256 KiB each). The frames' pages are checked against the hash list, the
// hash list against the digest the index pins: a partly fetched pack is as
// trusted as a whole one. Packs written before frames have no table; their
// faults fetch the whole pack as before.
const (
	framePages = 64
	// tableMagic is a zstd skippable frame's magic number (0x184D2A50 to
	// 0x184D2A5F are skippable); tableTag opens its contents.
	tableMagic = 0x184D2A5A
	tableTag   = "AENVFRM1"
)

// errNotFramed says a pack has no frame table: written before frames.
var errNotFramed = errors.New("pack has no frame table")

// encodeFrames appends raw (whole slots) to dst compressed in frames of
// framePages slots, then the frame table.
func encodeFrames(enc *zstd.Encoder, raw, dst []byte) []byte {
	var sizes []uint32
	for off := 0; off < len(raw); off += framePages * pageSize {
		before := len(dst)
		dst = enc.EncodeAll(raw[off:min(off+framePages*pageSize, len(raw))], dst)
		sizes = append(sizes, uint32(len(dst)-before))
	}
	dst = binary.LittleEndian.AppendUint32(dst, tableMagic)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(tableTag)+4*len(sizes)))
	dst = append(dst, tableTag...)
	for _, n := range sizes {
		dst = binary.LittleEndian.AppendUint32(dst, n)
	}
	return dst
}

// frameCount is how many frames hold raw bytes of slots.
func frameCount(raw int64) int {
	return int((raw/pageSize + framePages - 1) / framePages)
}

// tableBytes is the size of the table of a pack of raw bytes of slots.
func tableBytes(raw int64) int64 {
	return 8 + int64(len(tableTag)) + 4*int64(frameCount(raw))
}

// maxStoredBytes bounds a full pack as encodeFrames and the hash list
// make it.
func maxStoredBytes(enc *zstd.Encoder) int {
	frames := frameCount(packTarget)
	return frames*enc.MaxEncodedSize(framePages*pageSize) + int(tableBytes(packTarget)) + packTarget/pageSize*hashSize
}

// packTail is a framed pack's frame table and hash list.
type packTail struct {
	// starts[j] is frame j's offset in the pack; starts[len-1] the end
	// of the last.
	starts []int64
	hashes []byte
}

// parseTail reads a pack's tail: its last tableBytes+hashBytes bytes. The
// hash list must match the digest the index pins; the table must add up to
// the pack's frames. A pack without a table is errNotFramed.
func parseTail(p packRef, tail []byte) (*packTail, error) {
	tb := tableBytes(p.raw)
	if int64(len(tail)) != tb+p.hashBytes() || p.stored < int64(len(tail)) {
		return nil, fmt.Errorf("%w: pack %s: its tail is %d bytes, not %d", ErrCorrupt, p.name(), len(tail), tb+p.hashBytes())
	}
	hashes := tail[tb:]
	if sha256.Sum256(hashes) != p.hashes {
		return nil, fmt.Errorf("%w: pack %s: its hash list does not match its digest", ErrCorrupt, p.name())
	}
	table := tail[:tb]
	if binary.LittleEndian.Uint32(table) != tableMagic || int64(binary.LittleEndian.Uint32(table[4:])) != tb-8 ||
		string(table[8:8+len(tableTag)]) != tableTag {
		return nil, errNotFramed
	}
	sizes := table[8+len(tableTag):]
	t := &packTail{starts: make([]int64, 0, len(sizes)/4+1), hashes: hashes}
	var at int64
	for k := 0; k < len(sizes); k += 4 {
		t.starts = append(t.starts, at)
		at += int64(binary.LittleEndian.Uint32(sizes[k:]))
	}
	t.starts = append(t.starts, at)
	if at != p.stored-int64(len(tail)) {
		return nil, errNotFramed
	}
	return t, nil
}

// check says whether page, the first bytes of slot (a file's last page
// may be short; the rest of its slot is zeros), is what the pack's hash
// list says the slot holds.
func (t *packTail) check(slot int, page []byte) bool {
	if (slot+1)*hashSize > len(t.hashes) {
		return false
	}
	h := sha256.Sum256(page)
	return bytes.Equal(h[:], t.hashes[slot*hashSize:(slot+1)*hashSize])
}

// getRange reads bytes [from, to) of pack p by a ranged GET (from a server
// that ignores Range, cut from the whole object). The bytes are not
// checked here: callers check them against the hashes the index pins.
func (s *Store) getRange(ctx context.Context, p packRef, from, to int64) ([]byte, error) {
	body, err := s.openObject(ctx, s.packKey(p.name()), from, to, min(s.cfg.StallTimeout, rangeStallTimeout))
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("%w: pack %s missing", ErrCorrupt, p.name())
		}
		return nil, fmt.Errorf("pack %s: %w", p.name(), err)
	}
	defer body.Close()
	data := make([]byte, to-from)
	n, err := io.ReadFull(body, data)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("%w: pack %s: bytes %d-%d: %d bytes came, not %d", ErrCorrupt, p.name(), from, to-1, n, to-from)
	}
	if err != nil {
		return nil, fmt.Errorf("pack %s: %w", p.name(), err)
	}
	return data, nil
}

// fetchTail reads pack p's frame table and hash list by a ranged GET.
func (s *Store) fetchTail(ctx context.Context, p packRef) (*packTail, error) {
	n := tableBytes(p.raw) + p.hashBytes()
	if n >= p.stored {
		return nil, errNotFramed
	}
	tail, err := s.getRange(ctx, p, p.stored-n, p.stored)
	if err != nil {
		return nil, err
	}
	return parseTail(p, tail)
}

// fetchFrames reads frames (ascending, distinct) of pack p by ranged GETs,
// one for each run of consecutive frames, and returns them decoded. Their
// pages are not checked yet: the caller checks each page it uses (check),
// knowing its length.
func (s *Store) fetchFrames(ctx context.Context, p packRef, t *packTail, frames []int, dec *zstd.Decoder) (map[int][]byte, error) {
	out := make(map[int][]byte, len(frames))
	for k := 0; k < len(frames); {
		first := frames[k]
		last := first
		for k++; k < len(frames) && frames[k] == last+1; k++ {
			last = frames[k]
		}
		if first < 0 || last+1 >= len(t.starts) {
			return nil, fmt.Errorf("%w: pack %s has no frame %d", ErrCorrupt, p.name(), last)
		}
		data, err := s.getRange(ctx, p, t.starts[first], t.starts[last+1])
		if err != nil {
			return nil, err
		}
		for j := first; j <= last; j++ {
			at := t.starts[j] - t.starts[first]
			frame := data[at : at+t.starts[j+1]-t.starts[j]]
			want := min(framePages*pageSize, p.raw-int64(j)*framePages*pageSize)
			pages, err := dec.DecodeAll(frame, make([]byte, 0, want))
			if err != nil || int64(len(pages)) != want {
				return nil, fmt.Errorf("%w: pack %s: frame %d does not decode to its size", ErrCorrupt, p.name(), j)
			}
			out[j] = pages
		}
	}
	return out, nil
}
