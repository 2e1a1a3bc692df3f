package inboxmw

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
)

// This file gives the handler's output ids derived from its input, so that
// a handler that runs twice (a crash before the mark, a failed publish, a
// lost lease) returns the same messages twice and the next stage's inbox
// drops the second copies.
//
// The derivation: a UUID of version 8 (RFC 9562, section 5.8, the
// name-based example of appendix B.2 with SHA-256) over a domain that says
// what is derived, the input message's inbox key, and a name: the output's
// position for a returned message, the handler's own name for DerivedKey.
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

// Domains of the derivation: what a derived id is for.
const (
	outputDomain = "watermill-inbox output"
	namedDomain  = "watermill-inbox named"
)

// OutputID returns the id the middleware gives the message at position
// (from 0) of those returned by the handler of the message whose inbox key
// is inputKey, when that message has no IdempotencyKey of its own: it
// becomes both its IdempotencyKey metadata field
// ([keying.DefaultIDMetadataKey]) and its UUID. It is a UUID of version 8
// derived with SHA-256 from inputKey and position (see
// [Config.KeepOutputIDs]); the same arguments always give the same id.
func OutputID(inputKey string, position int) string {
	return deriveID(outputDomain, inputKey, strconv.Itoa(position))
}

// DerivedKey returns an id derived from the inbox key of the message whose
// handler got ctx (msg.Context()) and name, a name the handler chooses for
// one thing it does itself: the idempotency key of a payment API call, the
// IdempotencyKey of a message it publishes through its own publisher. A
// second run of the handler for the same message gets the same id, so the
// API or the next stage's inbox drops what it sent twice. Different names
// give different ids, and none is ever the id of a returned message
// ([OutputID]). The id is a UUID of version 8 derived with SHA-256 (36
// characters), which payment APIs accept as an idempotency key.
//
// It fails with an error wrapping [inbox.ErrNoKey] outside a handler under
// the inbox middleware, or for a message without an id (processed without
// deduplication), and with one wrapping [inbox.ErrInvalidArgument] when
// name is empty.
func DerivedKey(ctx context.Context, name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: inboxmw.DerivedKey: the name is empty", inbox.ErrInvalidArgument)
	}
	key := KeyFromCtx(ctx)
	if key == "" {
		return "", fmt.Errorf("%w: inboxmw.DerivedKey(%q): the context has no inbox key (not a handler's under the inbox middleware, or a message without an id)", inbox.ErrNoKey, name)
	}
	return deriveID(namedDomain, key, name), nil
}

// deriveID is the derivation described at the top of this file.
func deriveID(domain, key, name string) string {
	h := sha256.New()
	h.Write([]byte(domain))
	h.Write([]byte{0})
	h.Write([]byte(key))
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

// deriveOutputs gives each message of out without an IdempotencyKey the id
// [OutputID] derives from the input's key and its position: as its
// IdempotencyKey and its UUID. Messages with an IdempotencyKey are left as
// they are. The input message itself, returned as an output, is copied
// first, so the message the middleware and the router hold never changes.
// Nothing happens under Config.KeepOutputIDs or for an input without a key.
func (m *msgCall) deriveOutputs(out []*message.Message) {
	if m.key == "" || m.ib.cfg.KeepOutputIDs {
		return
	}
	for i, o := range out {
		if o == nil || o.Metadata.Get(keying.DefaultIDMetadataKey) != "" {
			continue
		}
		if o == m.msg {
			o = o.Copy()
			out[i] = o
		}
		id := OutputID(m.key, i)
		o.UUID = id
		if o.Metadata == nil {
			o.Metadata = message.Metadata{}
		}
		o.Metadata.Set(keying.DefaultIDMetadataKey, id)
	}
}
