package keying

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/watermill-inbox/inbox"
)

// DefaultIDMetadataKey is the metadata field [DefaultIDSources] reads the id
// from first: "IdempotencyKey", the header name of the inbox ADR.
const DefaultIDMetadataKey = "IdempotencyKey"

// IDSource yields the id of a message. [Builder.Key] asks its sources in order
// and takes the first non-empty id. Implementations must be safe for
// concurrent use.
type IDSource interface {
	// Name identifies the source in logs, metrics and errors, e.g.
	// "metadata:IdempotencyKey", "uuid" or "payload-sha256".
	Name() string

	// ID returns msg's id, or "" when this source has none for msg (the
	// builder then asks the next source). An error stops the resolution:
	// Builder.Key returns it wrapped with the source's name.
	ID(msg *message.Message) (string, error)
}

// FromMetadata returns an [IDSource] that yields the first non-empty value
// among msg's metadata fields names, in the order given. Names are matched
// exactly (case-sensitive, as [message.Metadata] is a plain map). Its name is
// "metadata:" followed by the names joined by commas. With no names it never
// yields an id.
func FromMetadata(names ...string) IDSource {
	return metadataSource{
		names: append([]string(nil), names...),
		name:  "metadata:" + strings.Join(names, ","),
	}
}

type metadataSource struct {
	names []string
	name  string
}

func (s metadataSource) Name() string { return s.name }

func (s metadataSource) ID(msg *message.Message) (string, error) {
	for _, n := range s.names {
		if v := msg.Metadata[n]; v != "" {
			return v, nil
		}
	}
	return "", nil
}

// FromUUID returns an [IDSource] named "uuid" that yields msg.UUID. Producers
// that publish the same message twice with a new UUID defeat it; give such
// messages an id in metadata.
func FromUUID() IDSource { return uuidSource{} }

type uuidSource struct{}

func (uuidSource) Name() string { return "uuid" }

func (uuidSource) ID(msg *message.Message) (string, error) { return msg.UUID, nil }

// FromPayloadHash returns an [IDSource] named "payload-sha256" that yields
// "sha256:" followed by the lower-case hex SHA-256 of msg.Payload (71 bytes).
// It never yields "": even an empty payload has a hash. It is an opt-in
// fallback: two different messages with equal payloads share a key, so the
// second is taken for a duplicate. Put it last.
func FromPayloadHash() IDSource { return payloadHashSource{} }

type payloadHashSource struct{}

func (payloadHashSource) Name() string { return "payload-sha256" }

func (payloadHashSource) ID(msg *message.Message) (string, error) {
	const prefix = "sha256:"
	sum := sha256.Sum256(msg.Payload)
	var buf [len(prefix) + 2*sha256.Size]byte
	copy(buf[:], prefix)
	hex.Encode(buf[len(prefix):], sum[:])
	return string(buf[:]), nil
}

// IDSourceFunc returns an [IDSource] with the given name whose ID calls f.
// Use it for ids found elsewhere, e.g. in the payload or the message context.
// A nil f yields an error wrapping [inbox.ErrInvalidArgument].
func IDSourceFunc(name string, f func(*message.Message) (string, error)) IDSource {
	return funcSource{name: name, f: f}
}

type funcSource struct {
	name string
	f    func(*message.Message) (string, error)
}

func (s funcSource) Name() string { return s.name }

func (s funcSource) ID(msg *message.Message) (string, error) {
	if s.f == nil {
		return "", newError(inbox.ErrInvalidArgument, "keying: id source %s: IDSourceFunc was given a nil function", s.name)
	}
	return s.f(msg)
}

// DefaultIDSources returns the sources a [Builder] uses when its IDSources is
// empty: [FromMetadata]([DefaultIDMetadataKey]), then [FromUUID]. Each call
// returns a new slice, so callers may append their own fallbacks to it.
func DefaultIDSources() []IDSource {
	return []IDSource{FromMetadata(DefaultIDMetadataKey), FromUUID()}
}
