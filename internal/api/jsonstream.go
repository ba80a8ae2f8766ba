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
	s.key(name)
	s.raw(`"`)
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
	s.raw(`"`)
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
