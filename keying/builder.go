package keying

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/watermill-inbox/inbox"
)

// Builder turns a message into its [Key]. Its zero value is not usable: set
// Bus and Group. A Builder is safe for concurrent use as long as its fields
// are not changed; [Builder.Key] applies the defaults without modifying it.
type Builder struct {
	// Bus is the bus segment of every key, e.g. "rabbit" or "kafka-prod".
	// Required.
	Bus string

	// Group is the group segment of every key: the consumer group or queue
	// the router consumes from. Watermill does not expose it, so it must be
	// configured. Required.
	Group string

	// Alias yields the alias segment of a message's key. Optional; default
	// [AliasFromHandler]: the name of the router handler.
	Alias AliasFunc

	// IDSources are asked in order for the message's id; the first non-empty
	// one wins. Optional; default [DefaultIDSources]: the "IdempotencyKey"
	// metadata field, then the message UUID.
	IDSources []IDSource
}

// defaultIDSources is what Key uses when Builder.IDSources is empty, made once
// so the hot path allocates nothing.
var defaultIDSources = DefaultIDSources()

// Validate checks b's configuration: Bus and Group non-empty, valid UTF-8
// without NUL bytes and short enough to leave room in a [MaxLen] key for a
// one-byte alias and a hashed id (escaped Bus and Group together at most 948
// bytes), and no nil entry in IDSources. Errors wrap
// [inbox.ErrInvalidArgument] and name the field.
func (b *Builder) Validate() error {
	if err := checkField("Bus", b.Bus); err != nil {
		return err
	}
	if err := checkField("Group", b.Group); err != nil {
		return err
	}
	for i, s := range b.IDSources {
		if s == nil {
			return newError(inbox.ErrInvalidArgument, "keying: Builder.IDSources[%d] is nil", i)
		}
	}
	bl, _ := escapedLen(b.Bus)
	gl, _ := escapedLen(b.Group)
	if room := MaxLen - (bl + gl + 3 + 1); room < hashedIDLen {
		return newError(inbox.ErrInvalidArgument,
			"keying: Builder.Bus (%d bytes escaped) and Builder.Group (%d bytes escaped) leave %d bytes of a %d-byte key for the alias and the id, fewer than the %d a one-byte alias and a hashed id need",
			bl, gl, MaxLen-(bl+gl+3), MaxLen, 1+hashedIDLen)
	}
	return nil
}

func checkField(field, v string) error {
	if _, c := scan(v); validSegment(v, c) {
		return nil
	}
	return fieldError(field, v)
}

// fieldError says why v is not a valid value for Builder's field; v must be
// invalid (see validSegment).
func fieldError(field, v string) error {
	switch {
	case v == "":
		return newError(inbox.ErrInvalidArgument, "keying: Builder.%s is empty", field)
	case !utf8.ValidString(v):
		return newError(inbox.ErrInvalidArgument, "keying: Builder.%s %s is not valid UTF-8", field, quote(v))
	default:
		return newError(inbox.ErrInvalidArgument, "keying: Builder.%s %s holds a NUL byte", field, quote(v))
	}
}

// Key resolves msg's key. source is the Name of the [IDSource] that gave the
// id.
//
// The alias comes from b.Alias and must be a valid segment. The id is the
// first non-empty one among b.IDSources; when no source yields one, the error
// wraps [inbox.ErrNoKey] and lists the sources tried. An error from a source
// or from the alias function stops the resolution (later sources are not
// asked) and is returned wrapped as "keying: id source NAME: ..." or
// "keying: alias of message UUID: ...".
//
// An id that would make the key longer than [MaxLen], that is not valid
// UTF-8, that holds a NUL byte, or that itself starts with [HashedIDPrefix] is
// replaced by [HashID](id): deterministic, so duplicates still match, and
// never equal to a raw id. If the key is still too long (a huge alias), the
// error wraps [inbox.ErrInvalidKey] and gives the segment lengths. Bus or
// Group that [Builder.Validate] would reject give an error wrapping
// [inbox.ErrInvalidArgument].
//
// On error, k is the zero Key and source is empty. A key Key returns always
// passes [Key.Validate].
func (b *Builder) Key(msg *message.Message) (k Key, source string, err error) {
	k, _, source, err = b.resolve(msg)
	return k, source, err
}

// KeyString is [Builder.Key] followed by [Key.String], without measuring the
// segments twice. It allocates only the key string in the common case.
func (b *Builder) KeyString(msg *message.Message) (key string, source string, err error) {
	k, l, source, err := b.resolve(msg)
	if err != nil {
		return "", source, err
	}
	return keyString(k, l), source, nil
}

// AppendKey is [Builder.KeyString] appending the key to dst instead of
// allocating a string for it, for callers that keep keys in buffers of their
// own (the middleware keeps a message's key and lease id in one allocation
// with the rest of its state). On error dst is returned unchanged.
func (b *Builder) AppendKey(dst []byte, msg *message.Message) (key []byte, source string, err error) {
	k, l, source, err := b.resolve(msg)
	if err != nil {
		return dst, source, err
	}
	return appendKey(dst, k, l), source, nil
}

// lengths are the escaped lengths of a key's first three segments.
type lengths struct {
	bus, group, alias          int
	busEsc, groupEsc, aliasEsc bool
}

func (b *Builder) resolve(msg *message.Message) (Key, lengths, string, error) {
	var l lengths
	if msg == nil {
		return Key{}, l, "", newError(inbox.ErrInvalidArgument, "keying: message is nil")
	}
	var c uint8
	if l.bus, c = scan(b.Bus); !validSegment(b.Bus, c) {
		return Key{}, l, "", fieldError("Bus", b.Bus)
	}
	l.busEsc = c&classEscape != 0
	if l.group, c = scan(b.Group); !validSegment(b.Group, c) {
		return Key{}, l, "", fieldError("Group", b.Group)
	}
	l.groupEsc = c&classEscape != 0

	aliasFn := b.Alias
	if aliasFn == nil {
		aliasFn = aliasFromHandler
	}
	alias, err := aliasFn(msg)
	if err != nil {
		if _, ours := err.(*keyError); !ours {
			err = fmt.Errorf("keying: alias of message %s: %w", quote(msg.UUID), err)
		}
		return Key{}, l, "", err
	}
	if l.alias, c = scan(alias); !validSegment(alias, c) {
		return Key{}, l, "", segmentError("alias", alias)
	}
	l.aliasEsc = c&classEscape != 0

	sources := b.IDSources
	if len(sources) == 0 {
		sources = defaultIDSources
	}
	var id, source string
	for i, s := range sources {
		if s == nil {
			return Key{}, l, "", newError(inbox.ErrInvalidArgument, "keying: Builder.IDSources[%d] is nil", i)
		}
		v, err := s.ID(msg)
		if err != nil {
			if _, ours := err.(*keyError); !ours {
				err = fmt.Errorf("keying: id source %s: %w", s.Name(), err)
			}
			return Key{}, l, "", err
		}
		if v != "" {
			id, source = v, s.Name()
			break
		}
	}
	if id == "" {
		return Key{}, l, "", noKey(msg, sources)
	}

	fixed := l.bus + l.group + l.alias + 3
	if fixed+len(id) > MaxLen || mustHash(id) {
		id = HashID(id)
		if fixed+len(id) > MaxLen {
			return Key{}, l, "", invalidKey(
				"keying: key would be %d bytes even with the id hashed, longer than the limit of %d (escaped segment lengths: bus %d, group %d, alias %d, id %d): shorten the alias",
				fixed+len(id), MaxLen, l.bus, l.group, l.alias, len(id))
		}
	}
	return Key{Bus: b.Bus, Group: b.Group, Alias: alias, ID: id}, l, source, nil
}

// mustHash reports whether id, which fits in the key, cannot go into it
// verbatim.
func mustHash(id string) bool {
	_, c := scan(id)
	return !validSegment(id, c) || strings.HasPrefix(id, HashedIDPrefix)
}

func noKey(msg *message.Message, sources []IDSource) error {
	names := make([]string, len(sources))
	for i, s := range sources {
		names[i] = s.Name()
	}
	return newError(inbox.ErrNoKey, "keying: message %s has no id: none of the id sources gave one (tried %s)",
		quote(msg.UUID), strings.Join(names, ", "))
}
