package objectstore

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/treetar"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"
)

// The chunked format (formatChunks) stores an image as pages: every regular
// file is cut into 4 KiB pages, each page named by its SHA-256, and the pages
// a store lacks are packed into pack objects under Prefix/chunks/, named by
// the SHA-256 of their stored bytes. A pack is its pages in 4 KiB slots (a
// file's short last page padded with zeros), zstd-compressed, followed by
// the pages' hashes (32 bytes a slot, not compressed): the hashes travel
// with the pages, so an image that shares a pack does not repeat them. The
// image itself is an index object (@index.zst): the tree's tar headers
// without contents, the packs it uses (each with the digest of its hash
// list) and, in runs, which slot of which pack each page is. Manifest.Digest
// is the index's digest; the index pins every pack's digest and its hash
// list's, so one recorded digest still checks every byte.
//
// Why pages, keyed by content: a checkpoint's memory file (pages.img) holds
// the committed ranges of guest memory back to back, so a range committed or
// freed early moves everything after it; fixed chunks at file offsets then
// share almost nothing between two snapshots of one sandbox, while pages
// named by content are found wherever they moved. Pages are also the unit
// guest memory changes in: larger chunks turn scattered 4 KiB writes into
// whole chunks of new data. Content-defined chunking finds the same pages at
// several times the cost, since memory is page-aligned already.
//
// A Put shares the pages of the images it is given as parents (the same
// sandbox's earlier snapshot, the template it came from): only new pages are
// packed and uploaded. A Get fetches only the packs the node lacks, verifying
// each against the digest the index pins, before unpacking.
const (
	chunksDir    = "chunks"
	indexName    = "@index.zst"
	formatChunks = "chunks-v1"
	pageSize     = 4096
	// packTarget bounds a pack's raw bytes: large enough that a GiB is a
	// hundred objects, small enough that a restore holds a few in memory.
	packTarget = 8 << 20
	// maxIndexBytes bounds an index as stored and as decoded, and a
	// pack's stored size; maxPages bounds an image's pages (128 GiB), and
	// so the memory a Get of an index an attacker wrote can take (8 bytes
	// a page decoded).
	maxIndexBytes = 256 << 20
	maxPages      = 1 << 25
	// maxPackBytes bounds a pack object: its slots compressed (zstd adds
	// little to data it cannot shrink) and its hash list.
	maxPackBytes = 2 * packTarget
	// packsHeld is how many decoded packs a Get keeps in memory: pages of a
	// child image interleave its own packs with its parent's in order, so
	// a few suffice.
	packsHeld = 6
	// paxSize carries a regular file's size in the index's tar headers,
	// whose Size is 0 since the contents are pages.
	paxSize    = "AENV.size"
	indexMagic = "AENVCHK2"
	// hashSize is a slot's entry in a pack's hash list.
	hashSize = sha256.Size
)

// Parent is an image in the store whose pages a new image may share, with
// the digest its record pins.
type Parent struct {
	Key, Digest string
}

// packRef is a pack as an index names it: the digest of the whole object,
// its pages' bytes (raw: slots of pageSize), the object's size, and the
// digest of the hash list at its end.
type packRef struct {
	digest      [sha256.Size]byte
	raw, stored int64
	hashes      [sha256.Size]byte
}

func (p packRef) name() string { return hex.EncodeToString(p.digest[:]) }

// hashBytes is the length of the pack's hash list, its object's tail.
func (p packRef) hashBytes() int64 { return p.raw / pageSize * hashSize }

// pageRef locates one page: pack is 1 + an index into the image's packs, 0
// for a page of zeros (never stored); off is its slot's byte offset in the
// pack's pages.
type pageRef struct {
	pack uint32
	off  uint32
}

type chunkIndex struct {
	skeleton []byte // tar stream of headers; regular files have no contents
	packs    []packRef
	pages    []pageRef
}

// encode writes the index. Pages go as runs: consecutive pages in
// consecutive slots of one pack (or of zeros) are one entry, so an image
// that changed little from its parent has a small index.
func (ix *chunkIndex) encode() []byte {
	var b bytes.Buffer
	b.Grow(len(ix.skeleton) + len(ix.packs)*80 + 64)
	b.WriteString(indexMagic)
	b.Write(binary.AppendUvarint(nil, uint64(len(ix.skeleton))))
	b.Write(ix.skeleton)
	b.Write(binary.AppendUvarint(nil, uint64(len(ix.packs))))
	for _, p := range ix.packs {
		b.Write(p.digest[:])
		b.Write(binary.AppendUvarint(nil, uint64(p.raw)))
		b.Write(binary.AppendUvarint(nil, uint64(p.stored)))
		b.Write(p.hashes[:])
	}
	b.Write(binary.AppendUvarint(nil, uint64(len(ix.pages))))
	var buf [3 * binary.MaxVarintLen64]byte
	for i := 0; i < len(ix.pages); {
		first := ix.pages[i]
		n := 1
		for i+n < len(ix.pages) {
			next := ix.pages[i+n]
			if next.pack != first.pack || first.pack != 0 && int64(next.off) != int64(first.off)+int64(n)*pageSize {
				break
			}
			n++
		}
		k := binary.PutUvarint(buf[:], uint64(first.pack))
		k += binary.PutUvarint(buf[k:], uint64(n))
		if first.pack != 0 {
			k += binary.PutUvarint(buf[k:], uint64(first.off/pageSize))
		}
		b.Write(buf[:k])
		i += n
	}
	return b.Bytes()
}

var errIndex = fmt.Errorf("%w: malformed chunk index", ErrCorrupt)

func decodeIndex(data []byte) (*chunkIndex, error) {
	r := bytes.NewReader(data)
	magic := make([]byte, len(indexMagic))
	if _, err := io.ReadFull(r, magic); err != nil || string(magic) != indexMagic {
		return nil, errIndex
	}
	count := func(limit uint64) (int, error) {
		n, err := binary.ReadUvarint(r)
		if err != nil || n > limit || n > uint64(r.Len()) {
			return 0, errIndex
		}
		return int(n), nil
	}
	ix := &chunkIndex{}
	n, err := count(maxIndexBytes)
	if err != nil {
		return nil, err
	}
	ix.skeleton = make([]byte, n)
	if _, err := io.ReadFull(r, ix.skeleton); err != nil {
		return nil, errIndex
	}
	if n, err = count(1 << 24); err != nil {
		return nil, err
	}
	ix.packs = make([]packRef, n)
	for i := range ix.packs {
		p := &ix.packs[i]
		if _, err := io.ReadFull(r, p.digest[:]); err != nil {
			return nil, errIndex
		}
		raw, err1 := binary.ReadUvarint(r)
		stored, err2 := binary.ReadUvarint(r)
		if err1 != nil || err2 != nil || raw == 0 || raw%pageSize != 0 || raw > packTarget || stored > maxPackBytes {
			return nil, errIndex
		}
		p.raw, p.stored = int64(raw), int64(stored)
		if p.stored <= p.hashBytes() {
			return nil, errIndex
		}
		if _, err := io.ReadFull(r, p.hashes[:]); err != nil {
			return nil, errIndex
		}
	}
	total, err := binary.ReadUvarint(r)
	if err != nil || total > maxPages {
		return nil, errIndex
	}
	ix.pages = make([]pageRef, 0, min(total, uint64(r.Len())*pageSize))
	for uint64(len(ix.pages)) < total {
		pack, err1 := binary.ReadUvarint(r)
		n, err2 := binary.ReadUvarint(r)
		if err1 != nil || err2 != nil || pack > uint64(len(ix.packs)) || n == 0 || n > total-uint64(len(ix.pages)) {
			return nil, errIndex
		}
		var slot uint64
		if pack != 0 {
			slots := uint64(ix.packs[pack-1].raw / pageSize)
			if slot, err = binary.ReadUvarint(r); err != nil || slot >= slots || n > slots-slot {
				return nil, errIndex
			}
		}
		for k := range n {
			pg := pageRef{pack: uint32(pack)}
			if pack != 0 {
				pg.off = uint32((slot + k) * pageSize)
			}
			ix.pages = append(ix.pages, pg)
		}
	}
	if r.Len() != 0 {
		return nil, errIndex
	}
	return ix, nil
}

func (s *Store) chunksBase() string {
	if s.cfg.Prefix == "" {
		return chunksDir + "/"
	}
	return s.cfg.Prefix + "/" + chunksDir + "/"
}

func (s *Store) packKey(name string) string   { return s.chunksBase() + name }
func (s *Store) indexKey(key string) string   { return s.imageDir(key) + indexName }
func validPackName(name string) bool          { return validDigest("sha256:" + name) }
func (s *Store) localPack(name string) string { return filepath.Join(s.cfg.ChunkDir, name) }

// pageLoc is where a known page is: in a pack of the image being written
// (parent < 0) or of a parent.
type pageLoc struct {
	parent, pack int
	off          uint32
}

// imagePacker cuts an image's files into pages and packs the new ones.
type imagePacker struct {
	s   *Store
	ctx context.Context
	g   *errgroup.Group
	enc *zstd.Encoder

	known    map[[sha256.Size]byte]pageLoc
	learned  map[[sha256.Size]byte]bool // packs whose hash lists are in known
	parents  [][]packRef
	interned map[[sha256.Size]byte]uint32 // a parent's pack → 1 + index in packs

	packs   []*packRef // this image's, in index order; filled by the uploads
	pages   []pageRef
	cur     []byte // the pack being filled
	curSums []byte // its slots' hashes
	curAt   uint32 // its 1-based index
	free    chan []byte
	readBuf []byte
	// storedFree keeps compressed packs' buffers for reuse.
	storedFree chan []byte

	mu       sync.Mutex
	newBytes int64 // packs uploaded, as stored
	shared   int64 // page bytes found in a parent
	used     []bool
}

// PutImage uploads the directory tree dir as the image key in the chunked
// format, sharing the pages of parents (images already in the store, each
// checked against its recorded digest; one that cannot be read is skipped).
// As Put, it replaces any image of that key and writes the manifest last.
//
// Garbage collection keeps a pack while a manifest names it, and for its
// grace after the last manifest naming it is removed or replaced (see
// sweepChunks); a parent's manifest is read before its pages are shared:
// so a pack shared here cannot go before this manifest names it, as long
// as the Put ends within the grace.
func (s *Store) PutImage(ctx context.Context, key, dir string, parents []Parent) (Manifest, error) {
	if err := checkPut(key, dir); err != nil {
		return Manifest{}, err
	}
	// One encoder per pack in flight: EncodeAll calls share them.
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(s.cfg.PartConcurrency))
	if err != nil {
		return Manifest{}, err
	}
	defer enc.Close()
	g, gctx := errgroup.WithContext(ctx)
	p := &imagePacker{s: s, ctx: gctx, g: g, enc: enc,
		known: map[[sha256.Size]byte]pageLoc{}, interned: map[[sha256.Size]byte]uint32{}, learned: map[[sha256.Size]byte]bool{},
		free: make(chan []byte, s.cfg.PartConcurrency+1), storedFree: make(chan []byte, s.cfg.PartConcurrency+1)}
	for range s.cfg.PartConcurrency + 1 {
		p.free <- make([]byte, 0, packTarget)
	}
	var parentKeys []string
	for _, par := range parents {
		ix, err := s.readIndex(ctx, par.Key, par.Digest)
		if err != nil {
			if ctx.Err() != nil {
				return Manifest{}, fmt.Errorf("put %s: %w", key, ctx.Err())
			}
			continue // no sharing with it: the image is still whole
		}
		p.addParent(ctx, ix)
		parentKeys = append(parentKeys, par.Key)
	}
	var skeleton bytes.Buffer
	st, walkErr := treetar.Write(ctx, dir, &skeleton, treetar.Options{Special: true, Body: p.file})
	if walkErr == nil {
		walkErr = p.flush()
	}
	if err := g.Wait(); err != nil && walkErr == nil {
		walkErr = err
	}
	if walkErr != nil {
		return Manifest{}, fmt.Errorf("put %s: %w", key, walkErr)
	}
	ix := &chunkIndex{skeleton: skeleton.Bytes(), pages: p.pages}
	names := make([]string, len(p.packs))
	for i, pr := range p.packs {
		ix.packs = append(ix.packs, *pr)
		names[i] = pr.name()
	}
	encoded := ix.encode()
	if len(p.pages) > maxPages || len(encoded) > maxIndexBytes {
		// What a Get would refuse to read back.
		return Manifest{}, fmt.Errorf("put %s: %d pages (index of %d bytes): more than the format holds (%d pages, 128 GiB)",
			key, len(p.pages), len(encoded), maxPages)
	}
	body := enc.EncodeAll(encoded, nil)
	sum := sha256.Sum256(body)
	if _, err := s.upload(ctx, s.indexKey(key), bytes.NewReader(body)); err != nil {
		return Manifest{}, fmt.Errorf("put %s: index: %w", key, err)
	}
	var shareParent string
	for i, used := range p.used {
		if used {
			shareParent = parentKeys[i]
			break
		}
	}
	m := Manifest{
		Key:         key,
		Format:      formatChunks,
		Digest:      "sha256:" + hex.EncodeToString(sum[:]),
		Size:        int64(len(body)),
		Files:       st.Files,
		Bytes:       st.Bytes,
		Created:     s.cfg.Now().UTC(),
		Packs:       names,
		NewBytes:    p.newBytes + int64(len(body)),
		SharedBytes: p.shared,
		Parent:      shareParent,
	}
	// The manifest this one replaces keeps its packs for the grace.
	if _, err := s.release(ctx, key); err != nil {
		return Manifest{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := s.writeManifest(ctx, m); err != nil {
		return Manifest{}, err
	}
	// An earlier upload of this key in the whole format leaves its data
	// object behind; the manifest no longer names it.
	s.deleteObject(ctx, s.dataKey(key))
	s.trimChunks()
	return m, nil
}

func (s *Store) writeManifest(ctx context.Context, m Manifest) error {
	body, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("put %s: %w", m.Key, err)
	}
	_, err = s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        &s.cfg.Bucket,
		Key:           aws.String(s.manifestKey(m.Key)),
		Body:          bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))),
		ContentType:   aws.String("application/json"),
	})
	if err != nil {
		return fmt.Errorf("put %s: manifest: %w", m.Key, err)
	}
	return nil
}

// deleteObject removes one object, best effort (the collector removes what
// is left).
func (s *Store) deleteObject(ctx context.Context, name string) {
	s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.cfg.Bucket, Key: aws.String(name)})
}

// addParent learns the pages of a parent's packs from their hash lists.
// A pack whose list cannot be read (or does not match the digest the
// parent's index pins) is not shared: the image is whole all the same.
func (p *imagePacker) addParent(ctx context.Context, ix *chunkIndex) {
	n := len(p.parents)
	p.parents = append(p.parents, ix.packs)
	p.used = append(p.used, false)
	lists := make([][]byte, len(ix.packs))
	var g errgroup.Group
	g.SetLimit(2 * p.s.cfg.PartConcurrency)
	for j, pr := range ix.packs {
		if p.learned[pr.digest] {
			continue // an earlier parent's too: its pages are known
		}
		p.learned[pr.digest] = true
		g.Go(func() error {
			lists[j], _ = p.s.packHashes(ctx, pr)
			return nil
		})
	}
	g.Wait()
	for j, list := range lists {
		for slot := 0; slot*hashSize < len(list); slot++ {
			h := [sha256.Size]byte(list[slot*hashSize : (slot+1)*hashSize])
			if _, ok := p.known[h]; !ok {
				p.known[h] = pageLoc{parent: n, pack: j, off: uint32(slot * pageSize)}
			}
		}
	}
}

// packHashes returns the hash list of pack pr: from the chunk cache when
// the pack is there, else the object's tail from the store, checked
// against the digest the index pins.
func (s *Store) packHashes(ctx context.Context, pr packRef) ([]byte, error) {
	size := pr.hashBytes()
	if s.cfg.ChunkDir != "" {
		if f, err := os.Open(s.localPack(pr.name())); err == nil {
			list := make([]byte, size)
			_, err := f.ReadAt(list, pr.stored-size)
			f.Close()
			if err == nil && sha256.Sum256(list) == pr.hashes {
				return list, nil
			}
		}
	}
	list, err := s.getRange(ctx, pr, pr.stored-size, pr.stored)
	if err != nil {
		return nil, fmt.Errorf("hashes: %w", err)
	}
	if sha256.Sum256(list) != pr.hashes {
		return nil, fmt.Errorf("%w: hashes of pack %s do not match their digest", ErrCorrupt, pr.name())
	}
	return list, nil
}

// file is the walk's fileBody: the header with the size moved to a PAX
// record, then the file's pages.
func (p *imagePacker) file(tw *tar.Writer, hdr *tar.Header, f *os.File) (int64, error) {
	h := *hdr
	h.PAXRecords = map[string]string{paxSize: strconv.FormatInt(hdr.Size, 10)}
	for k, v := range hdr.PAXRecords {
		h.PAXRecords[k] = v
	}
	h.Size = 0
	if err := tw.WriteHeader(&h); err != nil {
		return 0, err
	}
	if p.readBuf == nil {
		p.readBuf = make([]byte, readSize)
	}
	var n int64
	for {
		k, err := io.ReadFull(f, p.readBuf)
		if k > 0 {
			n += int64(k)
			data := p.readBuf[:k]
			sums := p.hashPages(data)
			for i := 0; len(data) > 0; i++ {
				pg := data[:min(pageSize, len(data))]
				data = data[len(pg):]
				if err := p.page(pg, sums[i]); err != nil {
					return n, err
				}
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// readSize is how much of a file the packer reads at once: 256 pages,
// hashed in parallel.
const readSize = 1 << 20

// pageSum is a page's SHA-256, or zero for a page of zeros.
type pageSum struct {
	hash [sha256.Size]byte
	zero bool
}

var zeroPage [pageSize]byte

// isZero says whether b (a page or less) is all zeros.
func isZero(b []byte) bool {
	return bytes.Equal(b, zeroPage[:len(b)])
}

// hashPages hashes the pages of data (the last may be short), spread over
// the CPUs: hashing is most of the packer's work.
func (p *imagePacker) hashPages(data []byte) []pageSum {
	count := (len(data) + pageSize - 1) / pageSize
	sums := make([]pageSum, count)
	hash := func(from, to int) {
		for i := from; i < to; i++ {
			pg := data[i*pageSize : min((i+1)*pageSize, len(data))]
			if isZero(pg) {
				sums[i].zero = true
				continue
			}
			sums[i].hash = sha256.Sum256(pg)
		}
	}
	workers := min(runtime.GOMAXPROCS(0), count/16)
	if workers <= 1 {
		hash(0, count)
		return sums
	}
	var wg sync.WaitGroup
	per := (count + workers - 1) / workers
	for from := 0; from < count; from += per {
		wg.Go(func() { hash(from, min(from+per, count)) })
	}
	wg.Wait()
	return sums
}

func (p *imagePacker) page(data []byte, sum pageSum) error {
	if sum.zero {
		p.pages = append(p.pages, pageRef{})
		return nil
	}
	h := sum.hash
	if loc, ok := p.known[h]; ok {
		ref := pageRef{off: loc.off}
		if loc.parent < 0 {
			ref.pack = uint32(loc.pack) + 1
		} else {
			ref.pack = p.intern(loc.parent, loc.pack)
			p.shared += int64(len(data))
		}
		p.pages = append(p.pages, ref)
		return nil
	}
	if p.cur != nil && len(p.cur)+pageSize > packTarget {
		if err := p.flush(); err != nil {
			return err
		}
	}
	if p.cur == nil {
		select {
		case p.cur = <-p.free:
		case <-p.ctx.Done():
			return p.ctx.Err()
		}
		p.curSums = make([]byte, 0, packTarget/pageSize*hashSize)
		p.packs = append(p.packs, &packRef{})
		p.curAt = uint32(len(p.packs))
	}
	ref := pageRef{pack: p.curAt, off: uint32(len(p.cur))}
	p.cur = append(p.cur, data...)
	// A short page (a file's last) fills its slot with zeros: every page
	// starts at a slot, so runs of pages encode as one entry.
	p.cur = append(p.cur, zeroPage[:pageSize-len(data)]...)
	p.curSums = append(p.curSums, h[:]...)
	p.known[h] = pageLoc{parent: -1, pack: int(p.curAt) - 1, off: ref.off}
	p.pages = append(p.pages, ref)
	return nil
}

// intern returns the index (1-based) in this image's packs of a parent's
// pack, adding it at its first use. Keyed by digest: two parents often list
// the same pack (a snapshot's and the template it shares pages with).
func (p *imagePacker) intern(parent, pack int) uint32 {
	pr := p.parents[parent][pack]
	p.used[parent] = true
	if i, ok := p.interned[pr.digest]; ok {
		return i
	}
	p.packs = append(p.packs, &pr)
	i := uint32(len(p.packs))
	p.interned[pr.digest] = i
	return i
}

// flush compresses and uploads the pack being filled, in the background.
func (p *imagePacker) flush() error {
	if p.cur == nil {
		return nil
	}
	raw, sums, ref := p.cur, p.curSums, p.packs[p.curAt-1]
	p.cur, p.curSums = nil, nil
	p.g.Go(func() error {
		defer func() { p.free <- raw[:0] }()
		var buf []byte
		select {
		case buf = <-p.storedFree:
		default:
			buf = make([]byte, 0, maxStoredBytes(p.enc))
		}
		defer func() {
			select {
			case p.storedFree <- buf[:0]:
			default:
			}
		}()
		var stored []byte
		if p.s.unframedPacks {
			stored = p.enc.EncodeAll(raw, buf[:0])
		} else {
			stored = encodeFrames(p.enc, raw, buf[:0])
		}
		stored = append(stored, sums...)
		buf = stored
		*ref = packRef{digest: sha256.Sum256(stored), raw: int64(len(raw)), stored: int64(len(stored)),
			hashes: sha256.Sum256(sums)}
		name := ref.name()
		_, err := p.s.client.PutObject(p.ctx, &s3.PutObjectInput{
			Bucket:        &p.s.cfg.Bucket,
			Key:           aws.String(p.s.packKey(name)),
			Body:          bytes.NewReader(stored),
			ContentLength: aws.Int64(int64(len(stored))),
		}, unsignedPayload)
		if err != nil {
			return fmt.Errorf("upload pack %s: %w", name, err)
		}
		p.s.keepPack(name, stored)
		p.mu.Lock()
		p.newBytes += int64(len(stored))
		p.mu.Unlock()
		return nil
	})
	return nil
}

// readIndex reads and verifies the index of the chunked image key, whose
// manifest must be there and name digest.
func (s *Store) readIndex(ctx context.Context, key, digest string) (*chunkIndex, error) {
	if !validDigest(digest) {
		return nil, fmt.Errorf("index of %s: %w", key, ErrNoDigest)
	}
	m, err := s.Stat(ctx, key)
	if err != nil {
		return nil, err
	}
	if m.Digest != digest || m.Format != formatChunks {
		return nil, fmt.Errorf("index of %s: %w: its manifest says %s %s, recorded %s", key, ErrCorrupt, m.Format, m.Digest, digest)
	}
	return s.fetchIndex(ctx, m, digest)
}

func (s *Store) fetchIndex(ctx context.Context, m Manifest, digest string) (*chunkIndex, error) {
	r, err := s.openObject(ctx, s.indexKey(m.Key), 0, -1, s.cfg.StallTimeout)
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("%w: index missing", ErrCorrupt)
		}
		return nil, err
	}
	defer r.Close()
	body, err := io.ReadAll(io.LimitReader(r, min(m.Size, maxIndexBytes)+1))
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(body); "sha256:"+hex.EncodeToString(sum[:]) != digest {
		return nil, fmt.Errorf("%w: index digest %x, recorded at upload %s", ErrCorrupt, sum, digest)
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderMaxMemory(maxIndexBytes), zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	defer dec.Close()
	raw, err := dec.DecodeAll(body, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: index: %v", ErrCorrupt, err)
	}
	return decodeIndex(raw)
}

// fetchChunks unpacks the chunked image of m into dir: the packs it lacks
// are downloaded in parallel, each checked against its digest, in the order
// the unpacking reads them, which starts as soon as the first is in. With
// lazy (GetLazy), the file it names is written last, after lazy.Begin.
func (s *Store) fetchChunks(ctx context.Context, m Manifest, digest, dir string, lazy *LazyFile) (FetchStats, error) {
	var st FetchStats
	ix, err := s.fetchIndex(ctx, m, digest)
	if err != nil {
		return st, err
	}
	if s.cfg.ChunkDir != "" {
		names := make([]string, len(ix.packs))
		for k, p := range ix.packs {
			names[k] = p.name()
		}
		s.usePacks(names, 1)
		defer s.usePacks(names, -1)
		if spaceShort(s.cfg.FreeSpace, s.cfg.ChunkDir, s.cfg.ChunkMinFree) > 0 {
			// Room for what this fetch writes, before it writes.
			s.trimChunks()
		}
	}
	var fill *lazyFill
	if lazy != nil {
		first, count, size, ok, err := lazyPages(ix, lazy.Name)
		if err != nil {
			return st, err
		}
		if ok {
			fill = &lazyFill{name: lazy.Name, first: first, count: count, size: size, done: map[uint32]bool{},
				arrived: map[uint32]bool{}, wake: make(chan struct{}, 1)}
		}
	}
	packDir := s.cfg.ChunkDir
	if packDir == "" {
		// No chunk cache: the packs live beside the image while it is
		// unpacked.
		if packDir, err = os.MkdirTemp(filepath.Dir(dir), ".chunks-"); err != nil {
			return st, err
		}
		defer os.RemoveAll(packDir)
	}
	r := &packReader{ctx: ctx, s: s, dir: packDir, ix: ix, held: map[uint32][]byte{},
		arriving: map[uint32]*arrival{}, lazy: fill}
	// The order packs are first used in: the lazy file's last.
	var order []uint32
	seen := make([]bool, len(ix.packs))
	for p, pg := range ix.pages {
		if pg.pack == 0 || seen[pg.pack-1] {
			continue
		}
		if fill != nil && p >= fill.first && p < fill.first+fill.count {
			continue
		}
		seen[pg.pack-1] = true
		order = append(order, pg.pack)
	}
	if fill != nil {
		for _, pg := range ix.pages[fill.first : fill.first+fill.count] {
			if pg.pack != 0 && !seen[pg.pack-1] {
				seen[pg.pack-1] = true
				order = append(order, pg.pack)
				fill.lazyOnly++
			}
		}
	}
	// The packs missing here, in two rounds: those the other files use,
	// then (with a lazy file, once the image is handed over, so that the
	// handover is not slowed by them) the lazy file's.
	var missing, lazyMissing []uint32
	for n, i := range order {
		if _, err := os.Stat(filepath.Join(packDir, ix.packs[i-1].name())); err == nil {
			continue
		}
		r.arriving[i] = &arrival{done: make(chan struct{})}
		if fill != nil && n >= len(order)-fill.lazyOnly {
			lazyMissing = append(lazyMissing, i)
		} else {
			missing = append(missing, i)
		}
	}
	q := newPackQueue(missing)
	if fill == nil || len(lazyMissing) == 0 {
		q.close()
	}
	dctx, stop := context.WithCancel(ctx)
	defer stop()
	r.ctx = dctx
	var (
		mu        sync.Mutex
		dlErr     error
		downloads sync.WaitGroup
	)
	lazyOnly := make(map[uint32]bool, len(lazyMissing))
	for _, i := range lazyMissing {
		lazyOnly[i] = true
	}
	download := func(i uint32) {
		p, a := ix.packs[i-1], r.arriving[i]
		if lazyOnly[i] {
			a.err = fill.streamPack(dctx, s, packDir, i, p)
		} else {
			a.err = s.downloadPack(dctx, packDir, p)
		}
		close(a.done)
		mu.Lock()
		if a.err != nil {
			if dlErr == nil {
				dlErr = a.err
			}
		} else {
			st.Packs++
			st.Bytes += p.stored
		}
		mu.Unlock()
		if a.err != nil {
			stop() // the other downloads are of no use
			q.abort()
		}
		if fill != nil {
			fill.arrive(i)
		}
	}
	for range 2 * s.cfg.PartConcurrency {
		downloads.Add(1)
		go func() {
			defer downloads.Done()
			for {
				i, ok := q.next()
				if !ok {
					return
				}
				download(i)
			}
		}()
	}
	if fill != nil {
		fill.q = q
		fill.later = fill.endFirst(ix, lazyMissing)
		// A pack a read waits for is downloaded at once, beside the rest.
		fill.download = func(i uint32) {
			downloads.Add(1)
			go func() {
				defer downloads.Done()
				defer fill.fetched()
				download(i)
			}()
		}
	}
	err = r.unpackAll(dctx, dir, lazy)
	if err != nil {
		stop()
		q.abort()
	}
	if fill != nil {
		fill.stop()
	}
	r.held, r.lru = nil, nil
	downloads.Wait()
	// A download's failure is the cause of an unpacking stopped by it;
	// downloads stopped because the unpacking failed are not.
	if dlErr != nil && (err == nil || !errors.Is(dlErr, context.Canceled)) {
		err = dlErr
	}
	if err != nil {
		return st, err
	}
	s.trimChunks()
	return st, nil
}

// unpackAll writes the image's files, the lazy file (if any) last.
func (r *packReader) unpackAll(ctx context.Context, dir string, lazy *LazyFile) error {
	var err error
	if r.dec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(packTarget+pageSize)); err != nil {
		return err
	}
	defer r.dec.Close()
	// With a lazy file the others are made durable once it is written,
	// not before the handover: the restore reads them from the page cache,
	// and the image counts only once whole. (16 MiB of a checkpoint's
	// kernel state take ~8 ms to sync here, more on a network disk.)
	unpacked, err := r.unpack(ctx, dir, r.lazy == nil)
	if err != nil {
		return err
	}
	if unpacked != len(r.ix.pages) {
		return fmt.Errorf("%w: the index has %d pages, its files %d", ErrCorrupt, len(r.ix.pages), unpacked)
	}
	if fill := r.lazy; fill != nil {
		name := filepath.Join(dir, lazy.Name)
		if lazy.Resume != "" {
			// The file readers already hold: the one unpacked goes.
			if fi, err := os.Stat(lazy.Resume); err != nil {
				return fmt.Errorf("resume: %w", err)
			} else if fi.Size() != fill.size {
				return fmt.Errorf("resume %s: %d bytes, the image's %s has %d", lazy.Resume, fi.Size(), lazy.Name, fill.size)
			}
			if err := os.Remove(name); err != nil {
				return err
			}
			if err := os.Link(lazy.Resume, name+PartialSuffix); err != nil {
				return fmt.Errorf("resume %s: %w", lazy.Resume, err)
			}
		} else if err := os.Rename(name, name+PartialSuffix); err != nil {
			return err
		}
		f, err := os.OpenFile(name+PartialSuffix, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		fill.r = r
		fill.prepare(ctx, f)
		// Frame fetches end before the file closes (on failure too): once
		// run has written every page they are of no use, and a write of
		// theirs must not land after the file is closed and dated. (No
		// stream runs past a run that succeeded: run waits for every pack
		// to arrive. After a failure a stream may still write, and finds
		// the file closed.)
		defer fill.stopFrames()
		if fill.written, err = lazy.Begin(fill.size, fill.prioritize); err != nil {
			return err
		}
		close(fill.begun)
		fill.q.add(fill.later...)
		fill.q.close()
		if err := fill.run(ctx, f); err != nil {
			return err
		}
		fill.stopFrames()
		if err := f.Close(); err != nil {
			return err
		}
		if err := syncFiles(dir, f.Name()); err != nil {
			return err
		}
		// As the archive has it, as for every other file.
		if err := os.Chtimes(f.Name(), fill.mtime, fill.mtime); err != nil {
			return err
		}
		if err := os.Rename(name+PartialSuffix, name); err != nil {
			return err
		}
		// The file's name, durable before the entry is marked complete
		// (its metadata, written next, is what a restart believes).
		return syncDir(dir)
	}
	return nil
}

// arrival is a pack being downloaded: done closes when it is on disk
// (verified) or failed (err).
type arrival struct {
	done chan struct{}
	err  error
}

// unpack writes the image's files into dir and returns the pages it used;
// each is synced as it is written if sync.
func (r *packReader) unpack(ctx context.Context, dir string, sync bool) (int, error) {
	if _, err := treetar.Read(ctx, bytes.NewReader(r.ix.skeleton), dir, treetar.Options{Special: true, Fill: r.fill, Sync: sync}); err != nil {
		return r.next, err
	}
	return r.next, nil
}

// FetchStats counts what a Get downloaded of a chunked image.
type FetchStats struct {
	Packs int   // packs fetched from the store (the rest were on disk)
	Bytes int64 // their stored bytes
}

// getPack starts the download of the pack named name, whole.
func (s *Store) getPack(ctx context.Context, name string) (io.ReadCloser, error) {
	body, err := s.openObject(ctx, s.packKey(name), 0, -1, s.cfg.StallTimeout)
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("%w: pack %s missing", ErrCorrupt, name)
		}
		return nil, fmt.Errorf("pack %s: %w", name, err)
	}
	return body, nil
}

func (s *Store) downloadPack(ctx context.Context, dir string, p packRef) error {
	name := p.name()
	body, err := s.getPack(ctx, name)
	if err != nil {
		return err
	}
	defer body.Close()
	return keepDownloaded(dir, p, body, newPackBuffer(p), 0)
}

// newPackBuffer holds a download of pack p: one byte more than recorded,
// to tell a longer object.
func newPackBuffer(p packRef) []byte { return make([]byte, p.stored+1) }

// keepDownloaded reads the rest of pack p from body into data (from
// newPackBuffer; its first have bytes are read already), checks the pack
// whole against its digest and keeps it in dir.
func keepDownloaded(dir string, p packRef, body io.Reader, data []byte, have int64) error {
	name := p.name()
	n, err := io.ReadFull(body, data[have:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("pack %s: %w", name, err)
	}
	data = data[:have+int64(n)]
	if int64(len(data)) != p.stored || sha256.Sum256(data) != p.digest {
		return fmt.Errorf("%w: pack %s does not match its digest", ErrCorrupt, name)
	}
	return writePackFile(dir, name, data)
}

// keepPack saves a pack just uploaded in the chunk cache, so that this node
// never downloads what it wrote. Best effort: a pack missing later is
// fetched.
func (s *Store) keepPack(name string, data []byte) {
	if s.cfg.ChunkDir == "" {
		return
	}
	writePackFile(s.cfg.ChunkDir, name, data)
}

func writePackFile(dir, name string, data []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".part-")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("keep pack %s: %w", name, err)
	}
	return nil
}

// packReader fills an image's files from its pages, reading packs from the
// chunk directory (each checked against its digest as it is read).
type packReader struct {
	ctx  context.Context
	s    *Store
	dir  string
	ix   *chunkIndex
	dec  *zstd.Decoder
	next int // the next page to write
	held map[uint32][]byte
	lru  []uint32
	// arriving are the packs this Get downloads, by index (1-based).
	arriving map[uint32]*arrival
	// lazy, if not nil, is the file unpack leaves empty at its size, and
	// whose pages it skips: written after the rest (GetLazy).
	lazy *lazyFill
}

func (r *packReader) fill(f *os.File, hdr *tar.Header, _ io.Reader, buf []byte) (int64, error) {
	size, err := strconv.ParseInt(hdr.PAXRecords[paxSize], 10, 64)
	if err != nil || size < 0 {
		return 0, fmt.Errorf("%w: %s has no size", ErrCorrupt, hdr.Name)
	}
	if l := r.lazy; l != nil && r.next == l.first && path.Clean(hdr.Name) == l.name {
		// Written after the rest of the image; its pages skipped here.
		r.next += l.count
		l.mtime = hdr.ModTime
		return size, f.Truncate(size)
	}
	var (
		off     int64 // file offset of the next page
		runAt   int64 // file offset of buf's first byte
		written int64
	)
	run := buf[:0]
	write := func() error {
		if len(run) == 0 {
			return nil
		}
		if _, err := f.WriteAt(run, runAt); err != nil {
			return err
		}
		written += int64(len(run))
		run = run[:0]
		return nil
	}
	for off < size {
		if r.next >= len(r.ix.pages) {
			return written, fmt.Errorf("%w: the index ends inside %s", ErrCorrupt, hdr.Name)
		}
		pg := r.ix.pages[r.next]
		r.next++
		n := min(pageSize, size-off)
		if pg.pack == 0 {
			if err := write(); err != nil { // a hole
				return written, err
			}
			off += n
			continue
		}
		data, err := r.pack(pg.pack)
		if err != nil {
			return written, err
		}
		if int64(pg.off)+n > int64(len(data)) {
			return written, fmt.Errorf("%w: a page of %s lies past its pack", ErrCorrupt, hdr.Name)
		}
		if len(run) == 0 {
			runAt = off
		} else if len(run)+int(n) > cap(run) {
			if err := write(); err != nil {
				return written, err
			}
			runAt = off
		}
		run = append(run, data[pg.off:int64(pg.off)+n]...)
		off += n
	}
	if err := write(); err != nil {
		return written, err
	}
	return size, f.Truncate(size)
}

// pack returns the decoded pack i (1-based), reading it if it is not held.
func (r *packReader) pack(i uint32) ([]byte, error) {
	if data, ok := r.held[i]; ok {
		return data, nil
	}
	p := r.ix.packs[i-1]
	path := filepath.Join(r.dir, p.name())
	verified := false
	if a := r.arriving[i]; a != nil {
		select {
		case <-a.done:
		case <-r.ctx.Done():
			return nil, r.ctx.Err()
		}
		if a.err != nil {
			return nil, a.err
		}
		verified = true // checked as it arrived
	}
	stored, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		// Evicted since the downloads (another Get trimmed the cache).
		if err = r.s.downloadPack(r.ctx, r.dir, p); err == nil {
			stored, err = os.ReadFile(path)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("pack %s: %w", p.name(), err)
	}
	if int64(len(stored)) != p.stored || !verified && sha256.Sum256(stored) != p.digest {
		// Damaged on this node's disk: fetched again, checked as it comes.
		os.Remove(path)
		if err := r.s.downloadPack(r.ctx, r.dir, p); err != nil {
			return nil, err
		}
		if stored, err = os.ReadFile(path); err != nil {
			return nil, fmt.Errorf("pack %s: %w", p.name(), err)
		}
		if int64(len(stored)) != p.stored || sha256.Sum256(stored) != p.digest {
			return nil, fmt.Errorf("%w: pack %s on disk does not match its digest", ErrCorrupt, p.name())
		}
	}
	var buf []byte
	if len(r.lru) >= packsHeld {
		// The least recently used pack goes; its buffer takes this one.
		buf = r.held[r.lru[0]][:0]
		delete(r.held, r.lru[0])
		r.lru = r.lru[1:]
	}
	if int64(cap(buf)) < p.raw {
		buf = make([]byte, 0, p.raw)
	}
	data, err := r.dec.DecodeAll(stored[:p.stored-p.hashBytes()], buf)
	if err != nil || int64(len(data)) != p.raw {
		return nil, fmt.Errorf("%w: pack %s does not decode to its size", ErrCorrupt, p.name())
	}
	touch(path)
	r.held[i] = data
	r.lru = append(r.lru, i)
	return data, nil
}

// touch marks a pack as just used, for the cache's eviction order.
func touch(path string) {
	now := time.Now()
	os.Chtimes(path, now, now)
}

// partDebrisAge is how old a pack's unfinished temporary file must be
// before the cache's trim takes it for debris.
const partDebrisAge = time.Hour

// usePacks counts the packs names as used by one more fetch (delta 1) or
// one fewer (-1).
func (s *Store) usePacks(names []string, delta int) {
	s.packsMu.Lock()
	defer s.packsMu.Unlock()
	if s.packsInUse == nil {
		s.packsInUse = map[string]int{}
	}
	for _, n := range names {
		if s.packsInUse[n] += delta; s.packsInUse[n] <= 0 {
			delete(s.packsInUse, n)
		}
	}
}

// trimChunks evicts the least recently used packs beyond ChunkBytes, and,
// while ChunkDir's file system has less free than ChunkMinFree, those no
// fetch running uses; it also removes temporary files that writes cut
// short left. A Get that finds a pack gone (evicted by the budget during
// its run) fetches it again.
func (s *Store) trimChunks() {
	if s.cfg.ChunkDir == "" {
		return
	}
	s.trimMu.Lock()
	defer s.trimMu.Unlock()
	entries, err := os.ReadDir(s.cfg.ChunkDir)
	if err != nil {
		return
	}
	type pack struct {
		name string
		size int64
		used time.Time
	}
	var (
		packs []pack
		total int64
	)
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		if strings.HasPrefix(e.Name(), ".part-") && time.Since(info.ModTime()) > partDebrisAge {
			// Left by a write a crash or a full disk cut short: a pack is
			// written in one go, so a live write's file is seconds old.
			os.Remove(filepath.Join(s.cfg.ChunkDir, e.Name()))
			continue
		}
		if !validPackName(e.Name()) {
			continue
		}
		packs = append(packs, pack{e.Name(), info.Size(), info.ModTime()})
		total += info.Size()
	}
	over := func() bool { return s.cfg.ChunkBytes > 0 && total > s.cfg.ChunkBytes }
	short := spaceShort(s.cfg.FreeSpace, s.cfg.ChunkDir, s.cfg.ChunkMinFree)
	if !over() && short <= 0 {
		return
	}
	slices.SortFunc(packs, func(a, b pack) int { return a.used.Compare(b.used) })
	s.packsMu.Lock()
	inUse := maps.Clone(s.packsInUse)
	s.packsMu.Unlock()
	for _, p := range packs {
		if !over() && short <= 0 {
			break
		}
		if !over() && inUse[p.name] > 0 {
			continue // for the floor alone: a fetch running reads it
		}
		if os.Remove(s.localPack(p.name)) == nil {
			total -= p.size
			short -= p.size
		}
	}
}

// ReclaimChunks evicts packs of the chunk cache if its file system has
// less free than ChunkMinFree (see trimChunks): writes keep the budget
// themselves; this is for a disk that fills from elsewhere, called on a
// clock. It lists the chunk cache only when the file system is short.
func (s *Store) ReclaimChunks() {
	if s.cfg.ChunkDir == "" || spaceShort(s.cfg.FreeSpace, s.cfg.ChunkDir, s.cfg.ChunkMinFree) <= 0 {
		return
	}
	s.trimChunks()
}

// releasedPrefix begins the names of the objects a chunked manifest leaves
// when it is removed or replaced: the packs it named, which the collector
// keeps for its grace from then on.
const releasedPrefix = "@released-"

type releasedPacks struct {
	Packs []string `json:"packs"`
}

// release records the packs of key's chunked manifest, about to be removed
// or replaced, as still referenced: an upload that read the manifest shares
// them and names them in its own manifest within the grace. It returns
// them. An image without a readable chunked manifest releases nothing.
func (s *Store) release(ctx context.Context, key string) ([]string, error) {
	m, err := s.Stat(ctx, key)
	switch {
	case errors.Is(err, ErrNotFound) || errors.Is(err, errMalformed) || errors.Is(err, ErrUnsupportedFormat):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("release %s: %w", key, err)
	case m.Format != formatChunks || len(m.Packs) == 0:
		return nil, nil
	}
	body, err := json.Marshal(releasedPacks{Packs: m.Packs})
	if err != nil {
		return nil, err
	}
	var nonce [4]byte
	rand.Read(nonce[:])
	name := fmt.Sprintf("%s%s%d-%x.json", s.imageDir(key), releasedPrefix, s.cfg.Now().UnixNano(), nonce)
	_, err = s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        &s.cfg.Bucket,
		Key:           aws.String(name),
		Body:          bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))),
		ContentType:   aws.String("application/json"),
	})
	if err != nil {
		return nil, fmt.Errorf("release %s: %w", key, err)
	}
	return m.Packs, nil
}

// errChanged stops a sweep whose listing no longer matches the bucket.
var errChanged = errors.New("an image changed during the collection; its packs are collected at the next")

// sweepChunks deletes the packs no image references. remaining are the
// images left after the collection, listed before the packs are, so a pack
// uploaded since (an upload in progress) is younger than cutoff and stays;
// released are the packs this collection's own deletions released.
//
// Why a pack an upload shares is never deleted before the upload's
// manifest names it: the upload chose its parent from a live record, read
// the parent's manifest, and ends within the grace. The parent's manifest
// goes only after its record (deleted, or found dead by the collector), and
// whoever removes or replaces it writes a released-packs object first,
// which references the packs for the grace, so until after the upload has
// ended. A manifest listed but gone when read stops the sweep: the
// released-packs object written before it went may have come after the
// listing.
func (s *Store) sweepChunks(ctx context.Context, remaining []*imageObjects, released []string, cutoff time.Time) (int, error) {
	referenced := map[string]bool{}
	for _, name := range released {
		referenced[name] = true
	}
	for _, im := range remaining {
		// A format that references packs must keep an index object, so
		// that its manifest is read here: Stat refuses a format it does
		// not know, which stops the sweep rather than lose its packs.
		if im.chunked && im.manifest {
			m, err := s.Stat(ctx, im.key)
			if errors.Is(err, ErrNotFound) {
				return 0, errChanged
			}
			if err != nil {
				// Its references are unknown: delete nothing this time.
				return 0, fmt.Errorf("read the references of %s: %w", im.key, err)
			}
			for _, name := range m.Packs {
				referenced[name] = true
			}
		}
		for _, r := range im.released {
			if !r.modified.After(cutoff) {
				// Expired: the uploads that could share its packs ended.
				if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.cfg.Bucket, Key: aws.String(r.name)}); err != nil && !isNotFound(err) {
					return 0, fmt.Errorf("delete %s: %w", r.name, err)
				}
				continue
			}
			packs, err := s.readReleased(ctx, r.name)
			if err != nil {
				return 0, err
			}
			for _, name := range packs {
				referenced[name] = true
			}
		}
	}
	deleted := 0
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.cfg.Bucket, Prefix: aws.String(s.chunksBase())})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return deleted, fmt.Errorf("list packs: %w", err)
		}
		for _, o := range page.Contents {
			name := strings.TrimPrefix(aws.ToString(o.Key), s.chunksBase())
			if !validPackName(name) || referenced[name] || aws.ToTime(o.LastModified).After(cutoff) {
				continue
			}
			if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.cfg.Bucket, Key: o.Key}); err != nil && !isNotFound(err) {
				return deleted, fmt.Errorf("delete pack %s: %w", name, err)
			}
			deleted++
		}
	}
	return deleted, nil
}

// readReleased reads the packs a released-packs object names; one gone
// since the listing (expired, another collector) names none.
func (s *Store) readReleased(ctx context.Context, name string) ([]string, error) {
	body, err := s.openObject(ctx, name, 0, -1, s.cfg.StallTimeout)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	defer body.Close()
	var r releasedPacks
	if err := json.NewDecoder(io.LimitReader(body, maxIndexBytes)).Decode(&r); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return r.Packs, nil
}
