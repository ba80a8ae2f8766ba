package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
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
// yields no byte for the store's stall timeout is cut, and a GET cut or
// broken is asked again by a ranged GET from the byte it stopped at.

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
)

// errStalled is the cause of a GET cut for going without a byte.
var errStalled = errors.New("no byte for the stall timeout")

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
	// tries counts the GETs asked again since a byte last came.
	tries int
	// length is the first answer's Content-Length.
	length   int64
	answered bool
}

// openObject starts reading bytes [from, to) of the object key (to < 0:
// to its end; from 0 and to < 0 asks no range), cutting GETs that go
// stallAfter without a byte. The first GET is made here, so that a
// missing object is told at once (isNotFound).
func (s *Store) openObject(ctx context.Context, key string, from, to int64, stallAfter time.Duration) (*objectBody, error) {
	b := &objectBody{ctx: ctx, s: s, key: key, from: from, to: to, stallAfter: stallAfter}
	for {
		err := b.get()
		if err == nil {
			return b, nil
		}
		if !b.again(err) {
			return nil, err
		}
	}
}

// get asks for the bytes from b.from on.
func (b *objectBody) get() error {
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
	out, err := b.s.client.GetObject(ctx, in)
	stall.Stop()
	if err != nil {
		cancel(nil)
		if cause := context.Cause(ctx); errors.Is(cause, errStalled) && b.ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		return err
	}
	b.body, b.actx, b.cancel, b.stall, b.skip = out.Body, ctx, cancel, stall, 0
	if !b.answered {
		b.length, b.answered = aws.ToInt64(out.ContentLength), true
	}
	if ranged && aws.ToString(out.ContentRange) == "" {
		b.s.rangesIgnored.Store(true)
		b.skip = b.from
	}
	return nil
}

// again says whether a GET that failed with err is asked again, after a
// pause, or err is final: the store's own answer (a missing object, a
// refusal; the SDK has retried those worth it), the caller's context
// done, or too many tries without a byte.
func (b *objectBody) again(err error) bool {
	var answered *smithyhttp.ResponseError
	if b.ctx.Err() != nil || errors.As(err, &answered) && answered.HTTPStatusCode() > 0 || b.tries >= maxResumes {
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
	for {
		if b.to >= 0 && b.from >= b.to {
			return 0, io.EOF
		}
		if b.body == nil {
			if err := b.get(); err != nil {
				if b.again(err) {
					continue
				}
				return 0, fmt.Errorf("read %s at byte %d: %w", b.key, b.from, err)
			}
		}
		if b.to >= 0 && int64(len(p)) > b.to-b.from {
			p = p[:b.to-b.from]
		}
		n, err := b.read(p)
		if n > 0 {
			b.tries = 0
			return n, nil // err, if any, comes again at the next read
		}
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) {
			return 0, io.EOF
		}
		b.close()
		if !b.again(err) {
			return 0, fmt.Errorf("read %s at byte %d: %w", b.key, b.from, err)
		}
	}
}

// read reads the current GET's body into p, past the bytes it skips, with
// the stall timer running.
func (b *objectBody) read(p []byte) (int, error) {
	b.stall.Reset(b.stallAfter)
	defer b.stall.Stop()
	for b.skip > 0 {
		n, err := b.body.Read(p[:min(int64(len(p)), b.skip)])
		b.skip -= int64(n)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // the object ends before from
			}
			return 0, b.cause(err)
		}
	}
	n, err := b.body.Read(p)
	b.from += int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		err = b.cause(err)
	}
	return n, err
}

// cause names a stall as the reason a body read failed.
func (b *objectBody) cause(err error) error {
	if errors.Is(context.Cause(b.actx), errStalled) && b.ctx.Err() == nil {
		return fmt.Errorf("%w: %w", errStalled, err)
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
}

func (b *objectBody) Close() error {
	b.close()
	return nil
}
