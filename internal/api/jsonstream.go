package api

import (
	"bufio"
	"encoding/base64"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// streamBufferBytes is the write buffer of a streamed JSON answer: what a
// large answer costs the server beyond the bytes it already holds.
const streamBufferBytes = 64 << 10

// jsonStream writes one JSON object field by field straight to the client.
// encoding/json would build the whole document first, and escaping can
// blow a byte up six times (a control byte becomes \u00XX), so a 64 MiB
// output could take gigabytes; here the cost is the fixed buffer whatever
// the bytes are. Write errors (a client that left) are remembered and end
// the answer; there is nothing else to do with them.
type jsonStream struct {
	w      *bufio.Writer
	fields int
	err    error
	// pending holds the start of a UTF-8 sequence split between the
	// parts of a string (see stringPart).
	pending  [utf8.UTFMax]byte
	npending int
}

// startJSON sends the status line and opens the object.
func startJSON(w http.ResponseWriter, status int) *jsonStream {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	s := &jsonStream{w: bufio.NewWriterSize(w, streamBufferBytes)}
	s.raw("{")
	return s
}

func (s *jsonStream) raw(text string) {
	if s.err == nil {
		_, s.err = s.w.WriteString(text)
	}
}

func (s *jsonStream) key(name string) {
	if s.fields > 0 {
		s.raw(",")
	}
	s.fields++
	s.raw(strconv.Quote(name)) // names are our own ASCII identifiers
	s.raw(":")
}

// String writes a string field from bytes of any content: invalid UTF-8
// becomes U+FFFD, as encoding/json does.
func (s *jsonStream) String(name string, b []byte) {
	s.openString(name)
	s.stringPart(b)
	s.closeString()
}

// openString starts a string field whose content follows in parts
// (stringPart), so that it can be written from pieces never joined in
// memory; closeString ends it.
func (s *jsonStream) openString(name string) {
	s.key(name)
	s.raw(`"`)
	s.npending = 0
}

// stringPart writes the next bytes of an open string. A UTF-8 sequence
// split between parts is held back (at most 3 bytes) until the next part
// completes it, so the result is the same as one String of the whole.
func (s *jsonStream) stringPart(b []byte) {
	for s.npending > 0 && len(b) > 0 {
		s.pending[s.npending] = b[0]
		s.npending++
		b = b[1:]
		n := s.text(s.pending[:s.npending], false)
		s.npending = copy(s.pending[:], s.pending[n:s.npending])
	}
	if s.npending > 0 { // b ran out before the sequence was complete
		return
	}
	n := s.text(b, false)
	s.npending = copy(s.pending[:], b[n:])
}

// closeString ends an open string; bytes still held back are an
// incomplete sequence and become U+FFFD.
func (s *jsonStream) closeString() {
	s.text(s.pending[:s.npending], true)
	s.npending = 0
	s.raw(`"`)
}

// text writes b escaped and returns how much of it was written: all of it
// when final, else all but an incomplete UTF-8 sequence at its end, which
// the next bytes may complete.
func (s *jsonStream) text(b []byte, final bool) int {
	start := 0
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			s.bytes(b[start:i])
			s.escape(c)
			i++
			start = i
			continue
		}
		if !final && !utf8.FullRune(b[i:]) {
			s.bytes(b[start:i])
			return i
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			s.bytes(b[start:i])
			s.raw(`\ufffd`)
			i++
			start = i
			continue
		}
		// U+2028 and U+2029 end lines in JavaScript source.
		if r == '\u2028' || r == '\u2029' {
			s.bytes(b[start:i])
			s.raw(`\u` + strconv.FormatInt(int64(r), 16))
			i += size
			start = i
			continue
		}
		i += size
	}
	s.bytes(b[start:])
	return len(b)
}

// Base64 writes a string field holding b in standard base64.
func (s *jsonStream) Base64(name string, b []byte) {
	s.key(name)
	s.raw(`"`)
	if s.err == nil {
		enc := base64.NewEncoder(base64.StdEncoding, s.w)
		if _, s.err = enc.Write(b); s.err == nil {
			s.err = enc.Close()
		}
	}
	s.raw(`"`)
}

// Int writes a number field.
func (s *jsonStream) Int(name string, n int) {
	s.key(name)
	s.raw(strconv.Itoa(n))
}

// Bool writes a boolean field.
func (s *jsonStream) Bool(name string, v bool) {
	s.key(name)
	s.raw(strconv.FormatBool(v))
}

// Close ends the object and flushes it.
func (s *jsonStream) Close() error {
	s.raw("}\n")
	if s.err == nil {
		s.err = s.w.Flush()
	}
	return s.err
}

func (s *jsonStream) bytes(b []byte) {
	if s.err == nil && len(b) > 0 {
		_, s.err = s.w.Write(b)
	}
}

// escape writes the JSON escape of an ASCII byte that cannot appear as
// is, without allocating: output can hold tens of millions of them.
func (s *jsonStream) escape(c byte) {
	if s.err != nil {
		return
	}
	switch c {
	case '"', '\\':
		s.err = s.w.WriteByte('\\')
		if s.err == nil {
			s.err = s.w.WriteByte(c)
		}
		return
	case '\n':
		s.raw(`\n`)
		return
	case '\r':
		s.raw(`\r`)
		return
	case '\t':
		s.raw(`\t`)
		return
	}
	const hex = "0123456789abcdef"
	s.raw(`\u00`)
	if s.err == nil {
		s.err = s.w.WriteByte(hex[c>>4])
	}
	if s.err == nil {
		s.err = s.w.WriteByte(hex[c&0xf])
	}
}
