package keying

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/watermill-inbox/inbox"
)

// Builder turns a message into its [Key]. Its zero value is not usable: set
// Bus and Group. A Builder is safe for concurrent use as long as its fields
// are not changed; [Builder.Key] applies the defaults without modifying it.
// A Builder checks Bus and Group on every call; to key many messages with
// one configuration, [Builder.Prepare] it once.
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
	bl, gl := escapedLen(b.Bus), escapedLen(b.Group)
	if room := MaxLen - (bl + gl + 3 + 1); room < hashedIDLen {
		return newError(inbox.ErrInvalidArgument,
			"keying: Builder.Bus (%d bytes escaped) and Builder.Group (%d bytes escaped) leave %d bytes of a %d-byte key for the alias and the id, fewer than the %d a one-byte alias and a hashed id need",
			bl, gl, MaxLen-(bl+gl+3), MaxLen, 1+hashedIDLen)
	}
	return nil
}

func checkField(field, v string) error {
	if validSegment(v) {
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
	r, err := b.resolve(msg)
	if err != nil {
		return Key{}, "", err
	}
	return Key{Bus: b.Bus, Group: b.Group, Alias: r.alias, ID: r.id}, r.source, nil
}

// KeyString is [Builder.Key] followed by [Key.String], without measuring the
// segments twice. It allocates only the key string in the common case.
func (b *Builder) KeyString(msg *message.Message) (key string, source string, err error) {
	r, err := b.resolve(msg)
	if err != nil {
		return "", "", err
	}
	var sb strings.Builder
	sb.Grow(escapedLen(b.Bus) + 1 + escapedLen(b.Group) + 1 + r.aliasLen + 1 + len(r.id))
	writeBusGroup(&sb, b.Bus, b.Group)
	return r.appendTo(&sb), r.source, nil
}

// resolve checks b's Bus and Group, then resolves msg's alias and id.
func (b *Builder) resolve(msg *message.Message) (resolved, error) {
	if msg == nil {
		return resolved{}, errNilMessage()
	}
	if !validSegment(b.Bus) {
		return resolved{}, fieldError("Bus", b.Bus)
	}
	if !validSegment(b.Group) {
		return resolved{}, fieldError("Group", b.Group)
	}
	return resolve(msg, b.Bus, b.Group, escapedLen(b.Bus)+escapedLen(b.Group)+2, b.Alias, b.IDSources)
}

// Prepare checks b with [Builder.Validate] and returns its [Prepared] form,
// which builds the same keys as b but escapes and measures Bus and Group
// once, here, rather than for every message. It copies b's fields: changing
// b afterwards does not change the Prepared.
func (b *Builder) Prepare() (*Prepared, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	var prefix strings.Builder
	prefix.Grow(escapedLen(b.Bus) + 1 + escapedLen(b.Group) + 1)
	writeBusGroup(&prefix, b.Bus, b.Group)
	return &Prepared{
		bus:     b.Bus,
		group:   b.Group,
		prefix:  prefix.String(),
		alias:   b.Alias,
		sources: slices.Clone(b.IDSources),
	}, nil
}

// Prepared is a [Builder] checked and with its "{bus}:{group}:" part built,
// made by [Builder.Prepare]. Its Key and KeyString give exactly what the
// Builder's give, and only look at each message's alias and id. It is safe
// for concurrent use. Its zero value is not usable: its methods fail with an
// error wrapping [inbox.ErrInvalidArgument].
type Prepared struct {
	bus, group string
	prefix     string // bus and group escaped, each followed by ':'
	alias      AliasFunc
	sources    []IDSource
}

// Key is [Builder.Key] of the Builder p was prepared from.
func (p *Prepared) Key(msg *message.Message) (k Key, source string, err error) {
	r, err := p.resolve(msg)
	if err != nil {
		return Key{}, "", err
	}
	return Key{Bus: p.bus, Group: p.group, Alias: r.alias, ID: r.id}, r.source, nil
}

// KeyString is [Builder.KeyString] of the Builder p was prepared from: the
// key as a string, the only allocation in the common case.
func (p *Prepared) KeyString(msg *message.Message) (key string, source string, err error) {
	r, err := p.resolve(msg)
	if err != nil {
		return "", "", err
	}
	var sb strings.Builder
	sb.Grow(len(p.prefix) + r.aliasLen + 1 + len(r.id))
	sb.WriteString(p.prefix)
	return r.appendTo(&sb), r.source, nil
}

func (p *Prepared) resolve(msg *message.Message) (resolved, error) {
	if msg == nil {
		return resolved{}, errNilMessage()
	}
	if p.prefix == "" {
		return resolved{}, newError(inbox.ErrInvalidArgument, "keying: the Prepared was not made by Builder.Prepare")
	}
	return resolve(msg, p.bus, p.group, len(p.prefix), p.alias, p.sources)
}

func errNilMessage() error {
	return newError(inbox.ErrInvalidArgument, "keying: message is nil")
}

// resolved is the part of a key that depends on the message.
type resolved struct {
	alias    string // unescaped
	aliasLen int    // escaped
	id       string // as it goes into the key: raw or hashed
	source   string // the name of the IDSource that gave the id
}

// writeBusGroup writes a key's first two segments to sb, escaped, each
// followed by a colon.
func writeBusGroup(sb *strings.Builder, bus, group string) {
	writeSegment(sb, bus)
	sb.WriteByte(':')
	writeSegment(sb, group)
	sb.WriteByte(':')
}

// appendTo writes the alias (escaped), a colon and the id to sb, which holds
// the key's bus and group, and returns the key.
func (r resolved) appendTo(sb *strings.Builder) string {
	writeSegment(sb, r.alias)
	sb.WriteByte(':')
	sb.WriteString(r.id)
	return sb.String()
}

// resolve resolves msg's alias with aliasFn and its id with sources (their
// defaults when nil or empty), for a key whose bus and group, valid, take
// prefixLen bytes with their colons once escaped.
func resolve(msg *message.Message, bus, group string, prefixLen int, aliasFn AliasFunc, sources []IDSource) (resolved, error) {
	if aliasFn == nil {
		aliasFn = aliasFromHandler
	}
	alias, err := aliasFn(msg)
	if err != nil {
		if _, ours := err.(*keyError); !ours {
			err = fmt.Errorf("keying: alias of message %s: %w", quote(msg.UUID), err)
		}
		return resolved{}, err
	}
	if !validSegment(alias) {
		return resolved{}, segmentError("alias", alias)
	}
	aliasLen := escapedLen(alias)

	if len(sources) == 0 {
		sources = defaultIDSources
	}
	var id, source string
	for i, s := range sources {
		if s == nil {
			return resolved{}, newError(inbox.ErrInvalidArgument, "keying: Builder.IDSources[%d] is nil", i)
		}
		v, err := s.ID(msg)
		if err != nil {
			if _, ours := err.(*keyError); !ours {
				err = fmt.Errorf("keying: id source %s: %w", s.Name(), err)
			}
			return resolved{}, err
		}
		if v != "" {
			id, source = v, s.Name()
			break
		}
	}
	if id == "" {
		return resolved{}, noKey(msg, sources)
	}

	fixed := prefixLen + aliasLen + 1
	if fixed+len(id) > MaxLen || mustHash(id) {
		id = HashID(id)
		if fixed+len(id) > MaxLen {
			return resolved{}, invalidKey(
				"keying: key would be %d bytes even with the id hashed, longer than the limit of %d (escaped segment lengths: bus %d, group %d, alias %d, id %d): shorten the alias",
				fixed+len(id), MaxLen, escapedLen(bus), escapedLen(group), aliasLen, len(id))
		}
	}
	return resolved{alias: alias, aliasLen: aliasLen, id: id, source: source}, nil
}

// mustHash reports whether id, which fits in the key, cannot go into it
// verbatim.
func mustHash(id string) bool {
	return !validSegment(id) || strings.HasPrefix(id, HashedIDPrefix)
}

func noKey(msg *message.Message, sources []IDSource) error {
	names := make([]string, len(sources))
	for i, s := range sources {
		names[i] = s.Name()
	}
	return newError(inbox.ErrNoKey, "keying: message %s has no id: none of the id sources gave one (tried %s)",
		quote(msg.UUID), strings.Join(names, ", "))
}
