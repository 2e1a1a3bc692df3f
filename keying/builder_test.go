package keying_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
)

// msgWith returns a message with the given UUID and metadata pairs.
func msgWith(uuid string, kv ...string) *message.Message {
	msg := message.NewMessage(uuid, []byte("payload"))
	for i := 0; i+1 < len(kv); i += 2 {
		msg.Metadata.Set(kv[i], kv[i+1])
	}
	return msg
}

// mustKey runs b.Key and b.KeyString on msg, checks that they agree and that
// the key is valid and parses back, and returns the key and its source.
func mustKey(t *testing.T, b *keying.Builder, msg *message.Message) (keying.Key, string) {
	t.Helper()
	k, source, err := b.Key(msg)
	if err != nil {
		t.Fatalf("Key: %v", err)
	}
	if err := k.Validate(); err != nil {
		t.Fatalf("Key returned %#v, which Validate rejects: %v", k, err)
	}
	s, source2, err := b.KeyString(msg)
	if err != nil {
		t.Fatalf("KeyString: %v", err)
	}
	if s != k.String() || source2 != source {
		t.Fatalf("KeyString = %q, %q; Key gave %q, %q", s, source2, k.String(), source)
	}
	if b.Validate() == nil {
		p, err := b.Prepare()
		if err != nil {
			t.Fatalf("Prepare: %v", err)
		}
		if pk, psource, err := p.Key(msg); err != nil || pk != k || psource != source {
			t.Fatalf("Prepared.Key = %#v, %q, %v; Builder.Key gave %#v, %q", pk, psource, err, k, source)
		}
		if ps, psource, err := p.KeyString(msg); err != nil || ps != s || psource != source {
			t.Fatalf("Prepared.KeyString = %q, %q, %v; Builder.KeyString gave %q, %q", ps, psource, err, s, source)
		}
	}
	if p, err := keying.Parse(s); err != nil || p != k {
		t.Fatalf("Parse(%q) = %#v, %v; want %#v", s, p, err, k)
	}
	return k, source
}

func TestBuilder_Key_id_resolution_order(t *testing.T) {
	t.Parallel()
	static := keying.StaticAlias("OrderPlaced")
	tests := []struct {
		name       string
		sources    []keying.IDSource
		msg        *message.Message
		wantID     string
		wantSource string
	}{
		{"default: metadata before uuid", nil, msgWith("u-1", "IdempotencyKey", "idem-1"), "idem-1", "metadata:IdempotencyKey"},
		{"default: uuid when no metadata", nil, msgWith("u-1"), "u-1", "uuid"},
		{"default: empty metadata value skipped", nil, msgWith("u-1", "IdempotencyKey", ""), "u-1", "uuid"},
		{"default: metadata name is case-sensitive", nil, msgWith("u-1", "idempotencykey", "x"), "u-1", "uuid"},
		{"default: urn uuid id kept verbatim", nil, msgWith("urn:uuid:4b0c9a1e-4c3d-4f6a-9b1e-2d3c4b5a6f70"),
			"urn:uuid:4b0c9a1e-4c3d-4f6a-9b1e-2d3c4b5a6f70", "uuid"},
		{"custom order: uuid first", []keying.IDSource{keying.FromUUID(), keying.FromMetadata("IdempotencyKey")},
			msgWith("u-1", "IdempotencyKey", "idem-1"), "u-1", "uuid"},
		{"custom order: falls through to payload hash", []keying.IDSource{keying.FromMetadata("X"), keying.FromPayloadHash()},
			msgWith("u-1"), "sha256:" + sha256Hex("payload"), "payload-sha256"},
		{"empty id from a func source skipped", []keying.IDSource{
			keying.IDSourceFunc("nothing", func(*message.Message) (string, error) { return "", nil }),
			keying.FromUUID(),
		}, msgWith("u-1"), "u-1", "uuid"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := &keying.Builder{Bus: "rabbit", Group: "orders", Alias: static, IDSources: tc.sources}
			k, source := mustKey(t, b, tc.msg)
			want := keying.Key{Bus: "rabbit", Group: "orders", Alias: "OrderPlaced", ID: tc.wantID}
			if k != want || source != tc.wantSource {
				t.Errorf("Key = %#v from %q, want %#v from %q", k, source, want, tc.wantSource)
			}
		})
	}
}

func TestBuilder_Key_no_id(t *testing.T) {
	t.Parallel()
	b := &keying.Builder{Bus: "rabbit", Group: "orders", Alias: keying.StaticAlias("a")}
	k, source, err := b.Key(msgWith(""))
	wantErr(t, err, noKey, `message "" has no id`, "tried metadata:IdempotencyKey, uuid")
	if k != (keying.Key{}) || source != "" {
		t.Errorf("Key returned %#v, %q with its error", k, source)
	}
	_, _, err = b.KeyString(msgWith(""))
	wantErr(t, err, noKey)

	b.IDSources = []keying.IDSource{keying.FromMetadata("A", "B"), keying.IDSourceFunc("custom", func(*message.Message) (string, error) { return "", nil })}
	_, _, err = b.Key(msgWith("u-1"))
	wantErr(t, err, noKey, "tried metadata:A,B, custom")
}

func TestBuilder_Key_source_error_stops_resolution(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	b := &keying.Builder{Bus: "b", Group: "g", Alias: keying.StaticAlias("a"), IDSources: []keying.IDSource{
		keying.IDSourceFunc("payload-field", func(*message.Message) (string, error) { return "", boom }),
		keying.FromUUID(),
	}}
	_, source, err := b.Key(msgWith("u-1"))
	wantErr(t, err, []error{boom}, "keying: id source payload-field: boom")
	if source != "" {
		t.Errorf("source = %q with an error", source)
	}

	b.IDSources = []keying.IDSource{keying.IDSourceFunc("nil-func", nil)}
	_, _, err = b.Key(msgWith("u-1"))
	wantErr(t, err, invalidArg, "id source nil-func", "nil function")

	b.IDSources = []keying.IDSource{keying.FromUUID(), nil}
	_, _, err = b.Key(msgWith(""))
	wantErr(t, err, invalidArg, "Builder.IDSources[1] is nil")
}

func TestFromMetadata(t *testing.T) {
	t.Parallel()
	names := []string{"Idempotency-Key", "IdempotencyKey"}
	src := keying.FromMetadata(names...)
	names[0] = "changed" // FromMetadata keeps its own copy.
	if got := src.Name(); got != "metadata:Idempotency-Key,IdempotencyKey" {
		t.Errorf("Name() = %q", got)
	}
	tests := []struct {
		msg  *message.Message
		want string
	}{
		{msgWith("u", "Idempotency-Key", "first", "IdempotencyKey", "second"), "first"},
		{msgWith("u", "IdempotencyKey", "second"), "second"},
		{msgWith("u", "Idempotency-Key", "", "IdempotencyKey", "second"), "second"},
		{msgWith("u", "idempotency-key", "x", "IDEMPOTENCYKEY", "y"), ""},
		{msgWith("u"), ""},
		{&message.Message{UUID: "nil-metadata"}, ""},
	}
	for _, tc := range tests {
		got, err := src.ID(tc.msg)
		if err != nil || got != tc.want {
			t.Errorf("ID(metadata %v) = %q, %v; want %q", tc.msg.Metadata, got, err, tc.want)
		}
	}
	if got, _ := keying.FromMetadata().ID(msgWith("u", "", "x")); got != "" {
		t.Errorf("FromMetadata() with no names yielded %q", got)
	}
}

func TestFromUUID(t *testing.T) {
	t.Parallel()
	src := keying.FromUUID()
	if src.Name() != "uuid" {
		t.Errorf("Name() = %q", src.Name())
	}
	for _, uuid := range []string{"", "01J8Z", "urn:uuid:x"} {
		if got, err := src.ID(msgWith(uuid)); err != nil || got != uuid {
			t.Errorf("ID(uuid %q) = %q, %v", uuid, got, err)
		}
	}
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestFromPayloadHash(t *testing.T) {
	t.Parallel()
	src := keying.FromPayloadHash()
	if src.Name() != "payload-sha256" {
		t.Errorf("Name() = %q", src.Name())
	}
	for _, p := range []string{"", "payload", strings.Repeat("\xff", 10000)} {
		got, err := src.ID(message.NewMessage("u", []byte(p)))
		if want := "sha256:" + sha256Hex(p); err != nil || got != want {
			t.Errorf("ID(payload of %d bytes) = %q, %v; want %q", len(p), got, err, want)
		}
	}
	got, _ := src.ID(&message.Message{})
	if got != "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Errorf("ID(nil payload) = %q", got)
	}
}

func TestDefaultIDSources(t *testing.T) {
	t.Parallel()
	got := keying.DefaultIDSources()
	if len(got) != 2 || got[0].Name() != "metadata:"+keying.DefaultIDMetadataKey || got[1].Name() != "uuid" {
		t.Fatalf("DefaultIDSources() = %v", got)
	}
	got[0] = keying.FromPayloadHash()
	if again := keying.DefaultIDSources(); again[0].Name() != "metadata:IdempotencyKey" {
		t.Error("DefaultIDSources returns a shared slice: changing it changed the next result")
	}
}

func TestBuilder_Key_long_ids_hashed(t *testing.T) {
	t.Parallel()
	// Escaped prefix "kafka%3Aprod:orders:OrderPlaced:" is 32 bytes: the
	// escaping of the bus counts toward the limit.
	b := &keying.Builder{Bus: "kafka:prod", Group: "orders", Alias: keying.StaticAlias("OrderPlaced")}
	const prefix = "kafka%3Aprod:orders:OrderPlaced:"
	fits := strings.Repeat("i", keying.MaxLen-len(prefix))
	k, _ := mustKey(t, b, msgWith("u", "IdempotencyKey", fits))
	if k.ID != fits || len(k.String()) != keying.MaxLen {
		t.Errorf("key of exactly MaxLen: ID = %q (%d bytes), key %d bytes; want the raw id and %d bytes", k.ID, len(k.ID), len(k.String()), keying.MaxLen)
	}
	over := fits + "j"
	k, source := mustKey(t, b, msgWith("u", "IdempotencyKey", over))
	if k.ID != keying.HashID(over) || source != "metadata:IdempotencyKey" {
		t.Errorf("key one byte over MaxLen: ID = %q from %q, want HashID(id) = %q", k.ID, source, keying.HashID(over))
	}
	if got := k.String(); got != prefix+keying.HashID(over) {
		t.Errorf("String() = %q", got)
	}
	// Deterministic: the redelivery gets the same key.
	if k2, _ := mustKey(t, b, msgWith("other-uuid", "IdempotencyKey", over)); k2 != k {
		t.Errorf("same long id gave %#v then %#v", k, k2)
	}
	// A different long id gets a different key.
	if k3, _ := mustKey(t, b, msgWith("u", "IdempotencyKey", fits+"k")); k3 == k {
		t.Errorf("two long ids gave the same key %#v", k)
	}
}

func TestBuilder_Key_invalid_ids_hashed(t *testing.T) {
	t.Parallel()
	b := &keying.Builder{Bus: "b", Group: "g", Alias: keying.StaticAlias("a")}
	tests := []struct {
		name, id string
		hashed   bool
	}{
		{"invalid UTF-8", "id-\xff", true},
		{"truncated rune", "\xe6\x97", true},
		{"surrogate half", "\xed\xa0\x80", true},
		{"NUL", "a\x00b", true},
		{"only NUL", "\x00", true},
		{"hashed prefix", keying.HashedIDPrefix + "anything", true},
		{"exact hashed form", keying.HashID("x"), true},
		{"prefix alone", keying.HashedIDPrefix, true},
		{"prefix without colon", "~sha256", false},
		{"payload-hash form", "sha256:" + sha256Hex("x"), false},
		{"prefix upper-case", "~SHA256:x", false},
		{"prefix inside", "x~sha256:", false},
		{"unicode", "日本語🙂", false},
	}
	for _, tc := range tests {
		k, _ := mustKey(t, b, msgWith("u", "IdempotencyKey", tc.id))
		want := tc.id
		if tc.hashed {
			want = keying.HashID(tc.id)
		}
		if k.ID != want {
			t.Errorf("%s: id %q gave ID %q, want %q", tc.name, tc.id, k.ID, want)
		}
	}
}

func TestBuilder_Key_raw_id_never_collides_with_hashed_one(t *testing.T) {
	t.Parallel()
	b := &keying.Builder{Bus: "b", Group: "g", Alias: keying.StaticAlias("a")}
	long := strings.Repeat("x", 2000)
	hashedLong, _ := mustKey(t, b, msgWith("u", "IdempotencyKey", long))
	// A producer sends, as a raw id, exactly the hashed form of the long id.
	forged, _ := mustKey(t, b, msgWith("u", "IdempotencyKey", keying.HashID(long)))
	if hashedLong == forged {
		t.Fatalf("raw id %q and the long id it is the hash of share the key %q", keying.HashID(long), hashedLong)
	}
	if forged.ID != keying.HashID(keying.HashID(long)) {
		t.Errorf("raw id with the hash prefix: ID = %q, want it hashed", forged.ID)
	}
	bad, _ := mustKey(t, b, msgWith("u", "IdempotencyKey", "\xff"))
	forgedBad, _ := mustKey(t, b, msgWith("u", "IdempotencyKey", keying.HashID("\xff")))
	if bad == forgedBad {
		t.Fatalf("invalid id and its forged hash share the key %q", bad)
	}
}

func TestBuilder_Key_alias_too_long(t *testing.T) {
	t.Parallel()
	// bus+group+3 colons = 5 bytes; a hashed id is 72; so the longest alias
	// is 1024-5-72 = 947 bytes once the id is hashed.
	for _, tc := range []struct {
		aliasLen int
		ok       bool
	}{{947, true}, {948, false}, {5000, false}} {
		alias := strings.Repeat("a", tc.aliasLen)
		b := &keying.Builder{Bus: "b", Group: "g", Alias: keying.StaticAlias(alias)}
		msg := msgWith("u", "IdempotencyKey", strings.Repeat("i", 1000))
		if !tc.ok {
			_, _, err := b.Key(msg)
			wantErr(t, err, invalidKey, "even with the id hashed", "longer than the limit of 1024", "alias "+strconv.Itoa(tc.aliasLen), "id 72")
			continue
		}
		if k, _ := mustKey(t, b, msg); len(k.String()) != keying.MaxLen || !strings.HasPrefix(k.ID, keying.HashedIDPrefix) {
			t.Errorf("alias of %d bytes: key of %d bytes with ID %q", tc.aliasLen, len(k.String()), k.ID)
		}
	}
}

func TestBuilder_Key_alias_errors(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	tests := []struct {
		name      string
		alias     keying.AliasFunc
		sentinels []error
		want      []string
	}{
		{"empty static alias", keying.StaticAlias(""), invalidKey, []string{"keying: alias segment is empty"}},
		{"alias not UTF-8", keying.StaticAlias("\xff"), invalidKey, []string{"alias segment", "not valid UTF-8"}},
		{"alias NUL", keying.StaticAlias("a\x00"), invalidKey, []string{"alias segment", "NUL"}},
		{"alias func error", func(*message.Message) (string, error) { return "", boom }, []error{boom},
			[]string{`keying: alias of message "u-1": boom`}},
		{"default outside a router", nil, invalidKey, []string{`message "u-1" has no handler name in its context`, "Builder.Alias"}},
		{"metadata fallback outside a router", keying.AliasFromMetadata("type"), invalidKey, []string{"no handler name"}},
	}
	for _, tc := range tests {
		b := &keying.Builder{Bus: "b", Group: "g", Alias: tc.alias}
		k, source, err := b.Key(msgWith("u-1"))
		if k != (keying.Key{}) || source != "" {
			t.Errorf("%s: Key returned %#v, %q with its error", tc.name, k, source)
		}
		wantErr(t, err, tc.sentinels, tc.want...)
	}
}

func TestAliasFromHandler_outside_router(t *testing.T) {
	t.Parallel()
	alias, err := keying.AliasFromHandler()(msgWith("u-7"))
	wantErr(t, err, invalidKey, `keying: message "u-7" has no handler name`, "message.Router",
		`keying.StaticAlias("orders")`, `keying.AliasFromMetadata("type")`)
	if alias != "" {
		t.Errorf("alias = %q with an error", alias)
	}
}

func TestAliasFromMetadata(t *testing.T) {
	t.Parallel()
	f := keying.AliasFromMetadata("type")
	if got, err := f(msgWith("u", "type", "OrderPlaced")); err != nil || got != "OrderPlaced" {
		t.Errorf("alias = %q, %v; want OrderPlaced", got, err)
	}
	if _, err := f(msgWith("u", "Type", "OrderPlaced")); err == nil {
		t.Error("field names must match exactly: \"Type\" was taken for \"type\"")
	}
}

// TestBuilder_Key_in_router checks the default alias and the metadata
// fallback against the context a real Watermill router builds.
func TestBuilder_Key_in_router(t *testing.T) {
	t.Parallel()
	type result struct {
		key, source string
		err         error
	}
	def := &keying.Builder{Bus: "rabbit", Group: "orders-queue"}
	meta := &keying.Builder{Bus: "rabbit", Group: "orders-queue", Alias: keying.AliasFromMetadata("type")}
	msgs := []*message.Message{
		msgWith("uuid-1"),
		msgWith("uuid-2", "IdempotencyKey", "idem-2"),
		msgWith("uuid-3", "type", "OrderPlaced"),
	}
	got := consume(t, "orders:v2", msgs, func(msg *message.Message) [2]result {
		var r [2]result
		r[0].key, r[0].source, r[0].err = def.KeyString(msg)
		r[1].key, r[1].source, r[1].err = meta.KeyString(msg)
		return r
	})
	want := [][2]result{
		{{"rabbit:orders-queue:orders%3Av2:uuid-1", "uuid", nil}, {"rabbit:orders-queue:orders%3Av2:uuid-1", "uuid", nil}},
		{{"rabbit:orders-queue:orders%3Av2:idem-2", "metadata:IdempotencyKey", nil}, {"rabbit:orders-queue:orders%3Av2:idem-2", "metadata:IdempotencyKey", nil}},
		{{"rabbit:orders-queue:orders%3Av2:uuid-3", "uuid", nil}, {"rabbit:orders-queue:OrderPlaced:uuid-3", "uuid", nil}},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("message %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if def.Alias != nil || def.IDSources != nil {
		t.Errorf("Key changed the builder's config: %+v", def)
	}
}

func TestBuilder_Key_does_not_change_builder(t *testing.T) {
	t.Parallel()
	b := &keying.Builder{Bus: "b", Group: "g"}
	_, _, _ = b.Key(msgWith("u"))
	if b.Alias != nil || b.IDSources != nil || b.Bus != "b" || b.Group != "g" {
		t.Errorf("Key changed the builder: %+v", b)
	}
}

func TestBuilder_Key_invalid_config(t *testing.T) {
	t.Parallel()
	msg := msgWith("u")
	tests := []struct {
		b    keying.Builder
		want string
	}{
		{keying.Builder{Group: "g"}, "keying: Builder.Bus is empty"},
		{keying.Builder{Bus: "b"}, "keying: Builder.Group is empty"},
		{keying.Builder{Bus: "\xff", Group: "g"}, `keying: Builder.Bus "\xff" is not valid UTF-8`},
		{keying.Builder{Bus: "b", Group: "g\x00"}, `keying: Builder.Group "g\x00" holds a NUL byte`},
	}
	for _, tc := range tests {
		tc.b.Alias = keying.StaticAlias("a")
		_, _, err := tc.b.Key(msg)
		wantErr(t, err, invalidArg, tc.want)
		if errors.Is(err, inbox.ErrInvalidKey) {
			t.Errorf("config error %q wraps ErrInvalidKey", err)
		}
	}
	var b keying.Builder
	b.Bus, b.Group = "b", "g"
	_, _, err := b.Key(nil)
	wantErr(t, err, invalidArg, "keying: message is nil")
}

func TestBuilder_Validate(t *testing.T) {
	t.Parallel()
	// Escaped bus+group up to 948 bytes leave 1024-948-3 = 73 bytes: a
	// one-byte alias and a 72-byte hashed id.
	tests := []struct {
		name string
		b    keying.Builder
		want string // "" for valid
	}{
		{"minimal", keying.Builder{Bus: "rabbit", Group: "orders"}, ""},
		{"full", keying.Builder{Bus: "kafka:prod", Group: "g%", Alias: keying.StaticAlias("a"), IDSources: []keying.IDSource{keying.FromUUID()}}, ""},
		{"longest bus and group", keying.Builder{Bus: strings.Repeat("b", 900), Group: strings.Repeat("g", 48)}, ""},
		{"longest once escaped", keying.Builder{Bus: strings.Repeat("b", 900), Group: strings.Repeat(":", 16)}, ""},
		{"empty bus", keying.Builder{Group: "g"}, "keying: Builder.Bus is empty"},
		{"empty group", keying.Builder{Bus: "b"}, "keying: Builder.Group is empty"},
		{"bus not UTF-8", keying.Builder{Bus: "\xc3", Group: "g"}, `keying: Builder.Bus "\xc3" is not valid UTF-8`},
		{"group not UTF-8", keying.Builder{Bus: "b", Group: "\x80"}, "Builder.Group"},
		{"bus NUL", keying.Builder{Bus: "\x00", Group: "g"}, `keying: Builder.Bus "\x00" holds a NUL byte`},
		{"group NUL", keying.Builder{Bus: "b", Group: "g\x00"}, "Builder.Group"},
		{"nil id source", keying.Builder{Bus: "b", Group: "g", IDSources: []keying.IDSource{keying.FromUUID(), nil}}, "keying: Builder.IDSources[1] is nil"},
		{"no room for the id", keying.Builder{Bus: strings.Repeat("b", 900), Group: strings.Repeat("g", 49)},
			"Builder.Bus (900 bytes escaped) and Builder.Group (49 bytes escaped) leave 72 bytes"},
		{"no room once escaped", keying.Builder{Bus: strings.Repeat("b", 900), Group: strings.Repeat("%", 17)},
			"Builder.Group (51 bytes escaped)"},
	}
	for _, tc := range tests {
		err := tc.b.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: Validate() = %v, want nil", tc.name, err)
			}
			continue
		}
		wantErr(t, err, invalidArg, tc.want)
	}
}

// TestBuilder_Validate_leaves_room checks what Validate promises: a valid
// builder with a one-byte alias keys any id, however long.
func TestBuilder_Validate_leaves_room(t *testing.T) {
	t.Parallel()
	b := &keying.Builder{Bus: strings.Repeat("b", 900), Group: strings.Repeat(":", 16), Alias: keying.StaticAlias("a")}
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	k, _ := mustKey(t, b, msgWith("u", "IdempotencyKey", strings.Repeat("i", 5000)))
	if n := len(k.String()); n != keying.MaxLen {
		t.Errorf("key is %d bytes, want exactly %d", n, keying.MaxLen)
	}
}

// TestKey_allocations checks the costs the package documentation gives:
// Builder.Key and Prepared.Key allocate nothing, and the key strings one
// allocation each, escaped segments included.
func TestKey_allocations(t *testing.T) {
	b := &keying.Builder{Bus: "rabbit:eu", Group: "orders", Alias: keying.StaticAlias("placed%v2")}
	p, err := b.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	msg := msgWith("0b5d1c3e-6a1f-4f0e-9b7d-2c6f1e0a9d3b")
	k := keying.Key{Bus: "rabbit:eu", Group: "orders", Alias: "placed%v2", ID: msg.UUID}
	const want = "rabbit%3Aeu:orders:placed%25v2:0b5d1c3e-6a1f-4f0e-9b7d-2c6f1e0a9d3b"
	if got := k.String(); got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	mustKey(t, b, msg) // Builder and Prepared agree with String
	for _, tc := range []struct {
		name   string
		allocs float64
		f      func()
	}{
		{"Builder.Key", 0, func() { _, _, _ = b.Key(msg) }},
		{"Prepared.Key", 0, func() { _, _, _ = p.Key(msg) }},
		{"Builder.KeyString", 1, func() { _, _, _ = b.KeyString(msg) }},
		{"Prepared.KeyString", 1, func() { _, _, _ = p.KeyString(msg) }},
		{"Key.String", 1, func() { _ = k.String() }},
	} {
		if n := testing.AllocsPerRun(100, tc.f); n != tc.allocs {
			t.Errorf("%s: %v allocations, want %v", tc.name, n, tc.allocs)
		}
	}
}

// TestPrepare checks that Prepare fails as Validate does, and that a
// Prepared keeps the configuration it was made from.
func TestPrepare(t *testing.T) {
	t.Parallel()
	for _, b := range []keying.Builder{
		{Group: "g"},
		{Bus: "b\x00", Group: "g"},
		{Bus: "b", Group: "g", IDSources: []keying.IDSource{nil}},
		{Bus: strings.Repeat("b", 900), Group: strings.Repeat("g", 49)},
	} {
		p, err := b.Prepare()
		if verr := b.Validate(); err == nil || p != nil || err.Error() != verr.Error() {
			t.Errorf("Prepare() = %v, %v; Validate() = %v", p, err, verr)
		}
		wantErr(t, err, invalidArg)
	}

	sources := []keying.IDSource{keying.FromMetadata("id")}
	b := keying.Builder{Bus: "kafka:prod", Group: "orders", Alias: keying.StaticAlias("placed"), IDSources: sources}
	p, err := b.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	b.Bus, b.Group, b.Alias = "other", "other", keying.StaticAlias("other")
	sources[0] = keying.FromUUID()
	s, source, err := p.KeyString(msgWith("u", "id", "42"))
	if err != nil || s != "kafka%3Aprod:orders:placed:42" || source != "metadata:id" {
		t.Errorf("KeyString after the builder changed = %q, %q, %v; want the key of the builder as prepared", s, source, err)
	}
}

// TestPrepared_zero_value checks that a Prepared not made by Prepare fails
// rather than build a key without bus and group.
func TestPrepared_zero_value(t *testing.T) {
	t.Parallel()
	var p keying.Prepared
	k, source, err := p.Key(msgWith("u"))
	wantErr(t, err, invalidArg, "keying: the Prepared was not made by Builder.Prepare")
	if k != (keying.Key{}) || source != "" {
		t.Errorf("Key returned %#v, %q with its error", k, source)
	}
	s, _, err := p.KeyString(msgWith("u"))
	wantErr(t, err, invalidArg, "not made by Builder.Prepare")
	if s != "" {
		t.Errorf("KeyString returned %q with its error", s)
	}
}

// TestPrepared_errors checks that a Prepared fails where and as its Builder
// does.
func TestPrepared_errors(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	b := keying.Builder{Bus: "b", Group: "g", Alias: func(msg *message.Message) (string, error) {
		switch msg.UUID {
		case "alias-error":
			return "", boom
		case "alias-empty":
			return "", nil
		case "alias-long":
			return strings.Repeat("a", 948), nil
		}
		return "a", nil
	}}
	p, err := b.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range []*message.Message{nil, msgWith(""), msgWith("alias-error"), msgWith("alias-empty"),
		msgWith("alias-long", "IdempotencyKey", strings.Repeat("i", 1000))} {
		_, _, berr := b.Key(msg)
		k, source, err := p.Key(msg)
		if err == nil || berr == nil || err.Error() != berr.Error() || k != (keying.Key{}) || source != "" {
			t.Errorf("Prepared.Key = %#v, %q, %v; Builder.Key failed with %v", k, source, err, berr)
		}
		s, source, err := p.KeyString(msg)
		if err == nil || err.Error() != berr.Error() || s != "" || source != "" {
			t.Errorf("Prepared.KeyString = %q, %q, %v; Builder.Key failed with %v", s, source, err, berr)
		}
	}
}
