package egress

import (
	"bufio"
	"errors"
	"fmt"

	"golang.org/x/crypto/cryptobyte"
)

// clientHello is what the proxy reads of a TLS ClientHello.
type clientHello struct {
	serverName string // the SNI host name; "" when there is none
	ech        bool   // an encrypted_client_hello extension (real or GREASE)
	esni       bool   // the withdrawn encrypted_server_name extension
}

// TLS numbers the parser needs (RFC 8446, RFC 6066, the ECH draft).
const (
	recordTypeHandshake      = 0x16
	handshakeTypeClientHello = 1
	extServerName            = 0
	extECH                   = 0xfe0d
	extESNI                  = 0xffce
	maxRecordLen             = 1 << 14
	// maxHelloLen bounds the ClientHello the proxy reads; it must fit in
	// the connection's read buffer with its record headers.
	maxHelloLen = 24 << 10
)

var errNotClientHello = errors.New("not a TLS ClientHello")

// peekClientHello reads the ClientHello at the start of br without
// consuming it: whatever the proxy lets through starts with it.
func peekClientHello(br *bufio.Reader) (clientHello, error) {
	var msg []byte
	off := 0
	for {
		hdr, err := br.Peek(off + 5)
		if err != nil {
			return clientHello{}, fmt.Errorf("read TLS record: %w", err)
		}
		h := hdr[off:]
		if h[0] != recordTypeHandshake {
			return clientHello{}, errNotClientHello
		}
		n := int(h[3])<<8 | int(h[4])
		if n == 0 || n > maxRecordLen {
			return clientHello{}, fmt.Errorf("TLS record of %d bytes", n)
		}
		rec, err := br.Peek(off + 5 + n)
		if err != nil {
			return clientHello{}, fmt.Errorf("read TLS record: %w", err)
		}
		msg = append(msg, rec[off+5:]...)
		off += 5 + n
		if len(msg) < 4 {
			continue
		}
		if msg[0] != handshakeTypeClientHello {
			return clientHello{}, errNotClientHello
		}
		l := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
		if l > maxHelloLen {
			return clientHello{}, fmt.Errorf("ClientHello of %d bytes: at most %d", l, maxHelloLen)
		}
		if len(msg) >= 4+l {
			return parseClientHello(msg[4 : 4+l])
		}
	}
}

// parseClientHello reads the extensions of a ClientHello's body. A hello
// with two server_name extensions, or two host names, is refused: a server
// and the proxy could each read a different one.
func parseClientHello(body []byte) (clientHello, error) {
	var out clientHello
	s := cryptobyte.String(body)
	var version uint16
	var sessionID, suites, compression cryptobyte.String
	if !s.ReadUint16(&version) || !s.Skip(32) ||
		!s.ReadUint8LengthPrefixed(&sessionID) ||
		!s.ReadUint16LengthPrefixed(&suites) ||
		!s.ReadUint8LengthPrefixed(&compression) {
		return out, errors.New("malformed ClientHello")
	}
	if s.Empty() {
		return out, nil // no extensions, so no name
	}
	var exts cryptobyte.String
	if !s.ReadUint16LengthPrefixed(&exts) || !s.Empty() {
		return out, errors.New("malformed ClientHello extensions")
	}
	seen := map[uint16]bool{}
	for !exts.Empty() {
		var typ uint16
		var data cryptobyte.String
		if !exts.ReadUint16(&typ) || !exts.ReadUint16LengthPrefixed(&data) {
			return out, errors.New("malformed ClientHello extension")
		}
		if seen[typ] {
			return out, fmt.Errorf("ClientHello repeats extension %d", typ)
		}
		seen[typ] = true
		switch typ {
		case extServerName:
			name, err := parseServerName(data)
			if err != nil {
				return out, err
			}
			out.serverName = name
		case extECH:
			out.ech = true
		case extESNI:
			out.esni = true
		}
	}
	return out, nil
}

func parseServerName(data cryptobyte.String) (string, error) {
	var list cryptobyte.String
	if !data.ReadUint16LengthPrefixed(&list) || !data.Empty() {
		return "", errors.New("malformed server_name extension")
	}
	name := ""
	for !list.Empty() {
		var typ uint8
		var value cryptobyte.String
		if !list.ReadUint8(&typ) || !list.ReadUint16LengthPrefixed(&value) {
			return "", errors.New("malformed server_name entry")
		}
		if typ != 0 {
			continue
		}
		if name != "" {
			return "", errors.New("server_name names two hosts")
		}
		if len(value) == 0 {
			return "", errors.New("empty server_name")
		}
		for _, c := range value {
			if c <= ' ' || c >= 0x7f {
				return "", errors.New("server_name is not a host name")
			}
		}
		name = string(value)
	}
	return name, nil
}
