package inboxmw

import (
	"context"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
)

// This file gives the handler's output ids derived from its input
// (keying.DeriveID), so that a handler that runs twice (a crash before the
// mark, a failed publish, a lost lease) returns the same messages twice and
// the next stage's inbox drops the second copies.

// OutputID returns the id the middleware gives the message at position
// (from 0) of those returned by the handler of the message whose inbox key
// is inputKey, when that message has no IdempotencyKey of its own: it
// becomes both its IdempotencyKey metadata field
// ([keying.DefaultIDMetadataKey]) and its UUID. It is a UUID of version 8
// derived with SHA-256 from inputKey and position ([keying.DeriveID];
// see [Config.KeepOutputIDs]); the same arguments always give the same id.
func OutputID(inputKey string, position int) string {
	return keying.DeriveID(keying.OutputDomain, inputKey, strconv.Itoa(position))
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
	return keying.DeriveID(keying.NamedDomain, key, name), nil
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
