// Package keying computes the inbox key of a Watermill message: the string a
// store deduplicates by.
//
// # Format
//
// A key has four segments, in the format of the inbox ADR:
//
//	{bus}:{group}:{alias}:{idKey}
//
// The segments are:
//   - bus names the message bus or cluster ("rabbit", "kafka-prod"). Configured.
//   - group is the consumer group or queue. Configured: Watermill does not
//     expose it to handlers.
//   - alias names the kind of message, so that two handlers consuming the same
//     message keep separate records. By default it is the name of the router
//     handler ([message.HandlerNameFromCtx]); see [AliasFromHandler],
//     [AliasFromMetadata] and [StaticAlias].
//   - idKey identifies the message itself (see "Ids" below).
//
// Every segment is non-empty, valid UTF-8 and free of NUL bytes, and the whole
// key is at most [MaxLen] (1024) bytes, so every store accepts it
// ([inbox.ValidateKey]).
//
// # Escaping
//
// In bus, group and alias, and only there, two bytes are percent-escaped: '%'
// becomes "%25" and ':' becomes "%3A" (upper-case hex). No other byte is
// escaped. The id is written verbatim, colons included. [Parse] therefore
// splits a key at its first three colons and unescapes the first three
// segments, which recovers the [Key] exactly: Parse(k.String()) == k for every
// valid k. Parse accepts only what [Key.String] produces (no "%3a", no "%41",
// no lone '%'), so a key has one spelling and a parsed key prints back byte
// for byte.
//
// Because ids are kept verbatim, an id such as "urn:uuid:4b0c..." gives the
// same key that any ADR client computes for it, as long as bus, group and
// alias hold neither ':' nor '%' (they then need no escaping).
//
// # Ids
//
// A [Builder] asks its sources ([IDSource]) in order and takes the first
// non-empty id. The default order ([DefaultIDSources]) is the
// "IdempotencyKey" metadata field ([DefaultIDMetadataKey]), then the message
// UUID. [FromPayloadHash]
// (a SHA-256 of the payload) is an opt-in fallback: two different messages
// with the same content would share a key. Broker-specific sources (Kafka
// topic/partition/offset, AMQP MessageId) belong in subpackages
// (packages inboxkafka and inboxamqp, directories kafka/ and amqp/), so
// that this package imports no broker
// client. A message for which no source yields an id gets an error wrapping
// [inbox.ErrNoKey]; the middleware decides what to do with it.
//
// # Hashed ids
//
// An id is replaced by [HashID] of itself, "~sha256:" followed by 64
// lower-case hex digits, when it would make the key longer than [MaxLen],
// when it is not valid UTF-8, or when it holds a NUL byte. The hash is
// deterministic, so redeliveries of such a message still get the same key
// and are still deduplicated. An id that itself starts with [HashedIDPrefix]
// is hashed too, so a raw id can never collide with the hash of another one.
// An id whose key is exactly [MaxLen] bytes long stays as it is.
//
// # Errors
//
// Every error this package makes starts with "keying: ", names the segment or
// field at fault and the offending value (cut to 64 bytes), and wraps a
// sentinel of package inbox: [inbox.ErrInvalidKey] for bad keys and segments,
// [inbox.ErrInvalidArgument] for a bad [Builder], [inbox.ErrNoKey] for a
// message without an id. Test them with errors.Is.
//
// # Cost
//
// [Builder.Key] allocates nothing in the common case (id from metadata or the
// UUID, no hashing); [Key.String] and [Builder.KeyString] allocate the key
// string once. A [Builder] checks and measures its Bus and Group on every
// call; [Builder.Prepare] does that once and returns a [Prepared], whose Key
// and KeyString then look only at the message's alias and id. The
// middleware (package inboxmw) keys its messages with a Prepared.
package keying

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/watermill-inbox/inbox"
)

// MaxLen is the longest key, in bytes, that [Key.String] may produce and that
// [Key.Validate] and [Parse] accept: [inbox.MaxKeyLen].
const MaxLen = inbox.MaxKeyLen

// HashedIDPrefix starts every id that [HashID] produced: "~sha256:" followed
// by 64 lower-case hex digits.
const HashedIDPrefix = "~sha256:"

// hashedIDLen is len(HashID(x)) for any x.
const hashedIDLen = len(HashedIDPrefix) + 2*sha256.Size

// Key is the tuple an inbox key is made of. Its zero value is not a valid key;
// see [Key.Validate].
type Key struct {
	// Bus names the message bus, e.g. "rabbit" or "kafka-prod".
	Bus string
	// Group is the consumer group or queue.
	Group string
	// Alias names the kind of message; by default the router handler's name.
	Alias string
	// ID identifies the message, possibly as a [HashID].
	ID string
}

// String returns the key in the format {bus}:{group}:{alias}:{idKey}, with
// '%' and ':' escaped in bus, group and alias (see the package
// documentation). It does not validate k: call [Key.Validate] for that.
func (k Key) String() string {
	var b strings.Builder
	b.Grow(escapedLen(k.Bus) + escapedLen(k.Group) + escapedLen(k.Alias) + 3 + len(k.ID))
	writeBusGroup(&b, k.Bus, k.Group)
	writeSegment(&b, k.Alias)
	b.WriteByte(':')
	b.WriteString(k.ID)
	return b.String()
}

// Validate reports whether k is a valid key: every segment non-empty, valid
// UTF-8 and without a NUL byte, and String() at most [MaxLen] bytes. The
// error wraps [inbox.ErrInvalidKey] and names the segment and the fault.
func (k Key) Validate() error {
	segs := [4]string{k.Bus, k.Group, k.Alias, k.ID}
	for i, seg := range segs {
		if !validSegment(seg) {
			return segmentError(segmentNames[i], seg)
		}
	}
	bus, group, alias := escapedLen(k.Bus), escapedLen(k.Group), escapedLen(k.Alias)
	if n := bus + group + alias + 3 + len(k.ID); n > MaxLen { // the id is not escaped
		return tooLong(n, bus, group, alias, len(k.ID))
	}
	return nil
}

// Parse is the inverse of [Key.String]: it splits s at its first three colons
// and unescapes bus, group and alias. It accepts exactly the strings that
// String produces for a valid [Key], so Parse(k.String()) == k for every
// valid k, and a key Parse returns prints back as s byte for byte. It rejects
// keys with fewer than three colons, empty segments, escapes other than
// "%25" and "%3A" (including "%3a" and a lone '%'), invalid UTF-8, NUL bytes,
// and keys longer than [MaxLen]. The error wraps [inbox.ErrInvalidKey] and
// names the segment at fault.
func Parse(s string) (Key, error) {
	if s == "" {
		return Key{}, invalidKey("keying: key is empty")
	}
	var raw [3]string
	rest := s
	for i := range raw {
		j := strings.IndexByte(rest, ':')
		if j < 0 {
			return Key{}, invalidKey("keying: key %s has %d of the 3 colons a key needs ({bus}:{group}:{alias}:{id}): the %s segment is missing",
				quote(s), i, segmentNames[i+1])
		}
		raw[i] = rest[:j]
		rest = rest[j+1:]
	}
	if len(s) > MaxLen {
		return Key{}, tooLong(len(s), len(raw[0]), len(raw[1]), len(raw[2]), len(rest))
	}
	var k Key
	segs := [3]*string{&k.Bus, &k.Group, &k.Alias}
	for i, r := range raw {
		if !validSegment(r) {
			return Key{}, segmentError(segmentNames[i], r)
		}
		*segs[i] = r
		if strings.IndexByte(r, '%') >= 0 { // r holds no ':': Parse split at them
			v, err := unescape(segmentNames[i], r)
			if err != nil {
				return Key{}, err
			}
			*segs[i] = v
		}
	}
	if !validSegment(rest) {
		return Key{}, segmentError("id", rest)
	}
	k.ID = rest
	return k, nil
}

// HashID returns [HashedIDPrefix] followed by the lower-case hex SHA-256 of
// id: 72 bytes of ASCII whatever id is. It is deterministic, so the same id
// always gives the same key. [Builder.Key] uses it for ids that are too long
// or not valid for a key.
func HashID(id string) string {
	sum := sha256.Sum256([]byte(id))
	var buf [hashedIDLen]byte
	copy(buf[:], HashedIDPrefix)
	hex.Encode(buf[len(HashedIDPrefix):], sum[:])
	return string(buf[:])
}

var segmentNames = [4]string{"bus", "group", "alias", "id"}

// validSegment reports whether s is a valid segment: non-empty, valid UTF-8
// and free of NUL bytes.
func validSegment(s string) bool {
	return s != "" && strings.IndexByte(s, 0) < 0 && utf8.ValidString(s)
}

// escapedLen returns the length of s once escaped: each '%' and ':' takes
// three bytes.
func escapedLen(s string) int {
	return len(s) + 2*(strings.Count(s, "%")+strings.Count(s, ":"))
}

// writeSegment writes s to b, escaping '%' and ':'.
func writeSegment(b *strings.Builder, s string) {
	start := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '%':
			b.WriteString(s[start:i])
			b.WriteString("%25")
			start = i + 1
		case ':':
			b.WriteString(s[start:i])
			b.WriteString("%3A")
			start = i + 1
		}
	}
	b.WriteString(s[start:])
}

// unescape reverses writeSegment on the raw segment s of a parsed key,
// accepting only the canonical escapes "%25" and "%3A". Parse calls it only
// for segments holding a '%'.
func unescape(name, s string) (string, error) {
	i := strings.IndexByte(s, '%')
	var b strings.Builder
	b.Grow(len(s))
	off := 0 // offset of s within the raw segment, for error messages
	raw := s
	for i >= 0 {
		b.WriteString(s[:i])
		switch esc := s[i:min(i+3, len(s))]; esc {
		case "%25":
			b.WriteByte('%')
		case "%3A":
			b.WriteByte(':')
		default:
			return "", invalidKey("keying: %s segment %s has the escape %q at byte %d: only %%25 (for '%%') and %%3A (for ':') are allowed",
				name, quote(raw), esc, off+i)
		}
		s = s[i+3:]
		off += i + 3
		i = strings.IndexByte(s, '%')
	}
	b.WriteString(s)
	return b.String(), nil
}

// segmentError says why s is not a valid value for the segment name; s must
// be invalid (see validSegment).
func segmentError(name, s string) error {
	switch {
	case s == "":
		return invalidKey("keying: %s segment is empty", name)
	case !utf8.ValidString(s):
		return invalidKey("keying: %s segment %s is not valid UTF-8", name, quote(s))
	default:
		return invalidKey("keying: %s segment %s holds a NUL byte", name, quote(s))
	}
}

func tooLong(n, bus, group, alias, id int) error {
	return invalidKey("keying: key is %d bytes, longer than the limit of %d (escaped segment lengths: bus %d, group %d, alias %d, id %d)",
		n, MaxLen, bus, group, alias, id)
}

// maxQuote is how many bytes of a value an error message shows.
const maxQuote = 64

// quote returns s quoted for an error message, cut to maxQuote bytes.
func quote(s string) string {
	if len(s) <= maxQuote {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:maxQuote], len(s))
}

// keyError is the type of the errors this package makes itself. Its message
// starts with "keying: " and says what was wrong with which value; it wraps
// one of the sentinels of package inbox (ErrInvalidKey, ErrInvalidArgument or
// ErrNoKey), which callers test with errors.Is.
type keyError struct {
	msg      string
	sentinel error
}

func (e *keyError) Error() string { return e.msg }

// Unwrap returns the inbox sentinel e wraps.
func (e *keyError) Unwrap() error { return e.sentinel }

func newError(sentinel error, format string, args ...any) error {
	return &keyError{msg: fmt.Sprintf(format, args...), sentinel: sentinel}
}

func invalidKey(format string, args ...any) error {
	return newError(inbox.ErrInvalidKey, format, args...)
}
