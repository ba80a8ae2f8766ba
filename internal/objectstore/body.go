package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// Downloads that break or stall.
//
// The SDK retries a request that fails before its answer comes, but not an
// answer whose body breaks midway (a connection reset), and nothing times
// out a body that stops coming (a peer gone silent, a half-dead
// connection): the read waits forever, and so does the create or the
// sandbox behind it. objectBody reads an object through both: a GET that
// yields no byte for a stall timeout is cut, and a GET cut or broken is
// asked again by a ranged GET from the byte it stopped at, of the same
// version of the object (If-Match its first answer's ETag).

const (
	// defaultStallTimeout is how long a GET may go without a byte (its
	// answer's headers, or the next bytes of its body) before it is cut
	// and asked again. Long beside any healthy store's pauses; short
	// beside a user's patience.
	defaultStallTimeout = 30 * time.Second
	// rangeStallTimeout is the shorter stall timeout of a ranged read (a
	// frame, a pack's tail: a few hundred KiB a guest's fault may wait
	// on): asking again costs little, and a fetch of frames that fails
	// falls back to the pack's whole download.
	rangeStallTimeout = 5 * time.Second
	// maxResumes bounds the GETs asked again in a row without a byte
	// coming between them.
	maxResumes = 3
	// maxEmptyReads bounds the reads in a row that return nothing and no
	// error (io.ErrNoProgress past it).
	maxEmptyReads = 100
)

var (
	// errStalled is the cause of a download cut for going without a byte.
	errStalled = errors.New("download stalled: no byte for the stall timeout")
	// errBroken is a download that broke more often than it is asked
	// again. It wraps no transport error on purpose: a body cut short
	// (io.ErrUnexpectedEOF) is not a short object, which callers take
	// for a corrupt one.
	errBroken = errors.New("download broken")
	// errOtherRange is an answer to a resumed GET that is not the range
	// asked for.
	errOtherRange = errors.New("the store answered another range than asked")
)

// objectBody is bytes [from, to) of an object (to < 0: to its end), read
// through as many GETs as it takes.
type objectBody struct {
	ctx        context.Context
	s          *Store
	key        string
	from       int64 // the next byte's offset
	to         int64
	stallAfter time.Duration

	body   io.ReadCloser
	actx   context.Context // the current GET's
	cancel context.CancelCauseFunc
	stall  *time.Timer
	// skip is how many bytes of body precede from: a server that ignores
	// Range answers the whole object.
	skip int64
	// pending is an error the current GET's body returned with bytes,
	// handled at the next read; err is the download's final error, said
	// again at every read after it.
	pending error
	err     error
	// tries counts the GETs asked again since a byte last came; empty
	// the body's reads in a row that returned nothing.
	tries, empty int
	// The first answer's: its Content-Length, its ETag (resumes ask for
	// that version), and the object's size if it was the whole object
	// (-1 if not known).
	length int64
	etag   string
	size   int64
}

// openObject starts reading bytes [from, to) of the object key (to < 0:
// to its end; from 0 and to < 0 asks no range), cutting GETs that go
// stallAfter without a byte. The first GET is made here, so that a
// missing object is told at once (isNotFound).
func (s *Store) openObject(ctx context.Context, key string, from, to int64, stallAfter time.Duration) (*objectBody, error) {
	b := &objectBody{ctx: ctx, s: s, key: key, from: from, to: to, stallAfter: stallAfter, size: -1}
	for {
		out, err := b.get()
		if err == nil {
			b.length, b.etag = aws.ToInt64(out.ContentLength), aws.ToString(out.ETag)
			if from == 0 && to < 0 && out.ContentLength != nil {
				b.size = b.length
			}
			return b, nil
		}
		if !b.again(err) {
			return nil, err
		}
	}
}

// get asks for the bytes from b.from on, and returns the answer, whose
// body b now reads.
func (b *objectBody) get() (*s3.GetObjectOutput, error) {
	ctx, cancel := context.WithCancelCause(b.ctx)
	stall := time.AfterFunc(b.stallAfter, func() { cancel(errStalled) })
	in := &s3.GetObjectInput{Bucket: &b.s.cfg.Bucket, Key: aws.String(b.key)}
	ranged := b.from > 0 || b.to >= 0
	if ranged {
		end := ""
		if b.to >= 0 {
			end = fmt.Sprint(b.to - 1)
		}
		in.Range = aws.String(fmt.Sprintf("bytes=%d-%s", b.from, end))
	}
	if b.etag != "" && !strings.HasPrefix(b.etag, "W/") {
		// A weak ETag (a proxy that re-encodes) would never match.
		in.IfMatch = aws.String(b.etag)
	}
	out, err := b.s.client.GetObject(ctx, in)
	stall.Stop()
	if err != nil {
		cancel(nil)
		if errors.Is(context.Cause(ctx), errStalled) && b.ctx.Err() == nil {
			err = fmt.Errorf("%w (%v)", errStalled, err)
		}
		return nil, err
	}
	skip := int64(0)
	if ranged {
		// The status, not Content-Range, says whether the range was
		// honoured: a proxy may drop the header of a 206.
		status := http.StatusPartialContent
		if raw, ok := awsmiddleware.GetRawResponse(out.ResultMetadata).(*smithyhttp.Response); ok {
			status = raw.StatusCode
		}
		cr := aws.ToString(out.ContentRange)
		switch start, ok := rangeStart(cr); {
		case status == http.StatusOK:
			b.s.rangesIgnored.Store(true)
			skip = b.from
		case cr != "" && (!ok || start != b.from):
			out.Body.Close()
			cancel(nil)
			return nil, fmt.Errorf("%w: %q for bytes from %d", errOtherRange, cr, b.from)
		}
	}
	b.body, b.actx, b.cancel, b.stall, b.skip = out.Body, ctx, cancel, stall, skip
	return out, nil
}

// rangeStart is the first byte of a Content-Range ("bytes 10-99/100").
func rangeStart(cr string) (int64, bool) {
	rest, ok := strings.CutPrefix(cr, "bytes ")
	if !ok {
		return 0, false
	}
	first, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(first, 10, 64)
	return n, err == nil
}

// again says whether a GET that failed with err is asked again, after a
// pause, or err is final: the store's own answer (a missing object, a
// refusal, the object changed since the first answer; the SDK has retried
// those worth it), another range than asked, the caller's context done,
// or too many tries without a byte.
func (b *objectBody) again(err error) bool {
	var answered *smithyhttp.ResponseError
	if b.ctx.Err() != nil || errors.As(err, &answered) && answered.HTTPStatusCode() > 0 ||
		errors.Is(err, errOtherRange) || b.tries >= maxResumes {
		return false
	}
	b.tries++
	select {
	case <-b.ctx.Done():
		return false
	case <-time.After(time.Duration(b.tries) * 100 * time.Millisecond):
		return true
	}
}

func (b *objectBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if b.to >= 0 && b.from >= b.to || b.size >= 0 && b.from >= b.size {
			// All asked for has come (a resume at the object's end would
			// be refused).
			return 0, io.EOF
		}
		if b.body == nil {
			if _, err := b.get(); err != nil {
				if b.again(err) {
					continue
				}
				return 0, b.fail(err)
			}
		}
		if b.to >= 0 && int64(len(p)) > b.to-b.from {
			p = p[:b.to-b.from]
		}
		n, err := 0, b.pending
		b.pending = nil
		if err == nil {
			n, err = b.read(p)
		}
		if n > 0 {
			b.tries = 0
			b.pending = err
			return n, nil
		}
		if err == nil {
			continue // bounded: timedRead says io.ErrNoProgress in time
		}
		if err == io.EOF {
			return 0, io.EOF
		}
		b.close()
		if !b.again(err) {
			return 0, b.fail(err)
		}
	}
}

// fail ends the download with err, said at every read from now on: the
// caller's context's end as it is, a stall as one, anything else as a
// broken download.
func (b *objectBody) fail(err error) error {
	switch {
	case b.ctx.Err() != nil:
		b.err = fmt.Errorf("read %s: %w", b.key, context.Cause(b.ctx))
	case errors.Is(err, errStalled):
		b.err = fmt.Errorf("read %s at byte %d: %w", b.key, b.from, err)
	default:
		b.err = fmt.Errorf("read %s at byte %d: %w: %v", b.key, b.from, errBroken, err)
	}
	return b.err
}

// read reads the current GET's body into p, past the bytes it skips, with
// the stall timer running while it waits.
func (b *objectBody) read(p []byte) (int, error) {
	if b.skip > 0 {
		var scratch [32 << 10]byte
		for b.skip > 0 {
			n, err := b.timedRead(scratch[:min(int64(len(scratch)), b.skip)])
			b.skip -= int64(n)
			if err == io.EOF && b.skip == 0 {
				return 0, io.EOF // the object ends at from
			}
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF // the object ends before from
				}
				return 0, b.cause(err)
			}
		}
	}
	n, err := b.timedRead(p)
	b.from += int64(n)
	if err != nil && err != io.EOF {
		err = b.cause(err)
	}
	return n, err
}

// timedRead is one read of the current GET's body, cut if it waits the
// stall timeout; io.ErrNoProgress after maxEmptyReads in a row that
// return nothing.
func (b *objectBody) timedRead(p []byte) (int, error) {
	b.stall.Reset(b.stallAfter)
	n, err := b.body.Read(p)
	b.stall.Stop()
	if n > 0 || err != nil {
		b.empty = 0
	} else if b.empty++; b.empty >= maxEmptyReads {
		err = io.ErrNoProgress
	}
	return n, err
}

// cause names a stall as the reason a body read failed.
func (b *objectBody) cause(err error) error {
	if errors.Is(context.Cause(b.actx), errStalled) && b.ctx.Err() == nil {
		return fmt.Errorf("%w (%v)", errStalled, err)
	}
	return err
}

func (b *objectBody) close() {
	if b.body != nil {
		b.body.Close()
		b.body = nil
	}
	if b.cancel != nil {
		b.cancel(nil)
		b.cancel = nil
	}
	b.pending, b.empty = nil, 0
}

func (b *objectBody) Close() error {
	b.close()
	return nil
}
