package keying

import (
	"crypto/sha256"
	"encoding/hex"
)

// Derived ids: the ids the inbox middleware gives the messages a handler
// returns, and the ids a handler asks for what it sends itself, so that a
// handler that runs twice for one input (a crash before the mark, a failed
// publish, a lost lease) produces the same ids twice and the next stage
// drops the second copies.
//
// The derivation: a UUID of version 8 (RFC 9562, section 5.8, the
// name-based example of appendix B.2 with SHA-256) over a domain that says
// what is derived, the input message's inbox key, and a name: the output's
// position for a returned message, the handler's own name for a named id.
// Its 122 free bits are the first bits of
//
//	SHA-256(domain || 0x00 || inputKey || 0x00 || name)
//
// with the version (8) and the variant (0b10) bits set over them, written
// in the usual 8-4-4-4-12 lower-case hex form. The input key already names
// the bus, the consumer group, the handler (alias) and the message's id, so
// two handlers of one message, or one handler in two groups, derive
// different ids. The publish topic is not part of it: a router handler
// publishes all its messages to one topic, so it would add nothing.

// Domains of [DeriveID]: what a derived id is for.
const (
	// OutputDomain derives the ids of the messages a handler returns,
	// named by their position.
	OutputDomain = "watermill-inbox output"
	// NamedDomain derives the ids a handler asks for what it does itself,
	// named by the handler.
	NamedDomain = "watermill-inbox named"
)

// DeriveID returns the version 8 UUID derived from domain, inputKey and
// name (see the derivation above); the same arguments always give the same
// id.
func DeriveID(domain, inputKey, name string) string {
	h := sha256.New()
	h.Write([]byte(domain))
	h.Write([]byte{0})
	h.Write([]byte(inputKey))
	h.Write([]byte{0})
	h.Write([]byte(name))
	var sum [sha256.Size]byte
	b := h.Sum(sum[:0])[:16]
	b[6] = b[6]&0x0f | 0x80 // version 8
	b[8] = b[8]&0x3f | 0x80 // variant 0b10
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}
