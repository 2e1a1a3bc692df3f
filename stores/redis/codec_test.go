package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
)

// The record codec across its two languages ("Record layouts" in doc.go):
// what the client's Go codec writes, the scripts' decode and load read; what
// the scripts write, the Go decoder reads; layout by layout, field by field,
// on the shared Redis. The scripts' side runs through CodecScript, the
// prelude every script of the store starts with.

// luaRead is what the scripts' codec reads under key.
type luaRead struct {
	raw       redisstore.Record // decode's values
	rawOK     bool              // decode returned values
	view      redisstore.Record // load's values
	viewOK    bool              // load found a live record
	now       int64             // TIME, µs
	expiryMS  int64             // PEXPIRETIME, ms
	rawValues int               // how many values decode returned
}

// readLua runs CodecScript's read on key.
func readLua(t *testing.T, c *redis.Client, key string) (luaRead, error) {
	t.Helper()
	v, err := redisstore.CodecScript.Run(context.Background(), c, []string{key}, "read").Result()
	if err != nil {
		return luaRead{}, err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 4 {
		t.Fatalf("CodecScript read = %#v, want 4 values", v)
	}
	raw, _ := a[0].([]any)
	view, _ := a[1].([]any)
	r := luaRead{now: a[2].(int64), expiryMS: a[3].(int64), rawValues: len(raw)}
	if len(raw) > 0 {
		r.raw, r.rawOK = rawFromLua(t, raw), true
	}
	if len(view) > 0 {
		if len(view) != 12 {
			t.Fatalf("load returned %d values, want 12: %#v", len(view), view)
		}
		r.view, r.viewOK = fullFromLua(t, view), true
	}
	return r, nil
}

// rawFromLua maps decode's values to a Record by the layout of its kind.
func rawFromLua(t *testing.T, v []any) redisstore.Record {
	t.Helper()
	kind := v[0].(int64)
	n := map[int64]int{redisstore.KindFresh: 6, redisstore.KindCompleted: 8, redisstore.KindCompact: 6, redisstore.KindTomb: 7, redisstore.KindMarked: 6}[kind]
	if (kind == redisstore.KindCompact || kind == redisstore.KindTomb || kind == redisstore.KindMarked) && len(v) == n {
		r := redisstore.Record{Kind: kind, Attempts: v[1].(int64), FirstSeen: v[2].(int64), LastSeen: v[2].(int64) + v[3].(int64), PayloadHash: v[4].(string)}
		if kind == redisstore.KindMarked {
			r.LastSeen, r.TTL2 = 0, v[3].(int64)
		}
		if kind != redisstore.KindTomb {
			r.ID = v[5].(string)
		} else {
			r.Owner, r.Reason = v[5].(string), v[6].(string)
		}
		return r
	}
	if n == 0 {
		return fullFromLua(t, v)
	}
	if len(v) != n {
		t.Fatalf("decode returned %d values for kind %d, want %d: %#v", len(v), kind, n, v)
	}
	r := redisstore.Record{Kind: kind, ID: v[1].(string), Owner: v[2].(string), PayloadHash: v[3].(string), Lease: v[4].(int64), TTL: v[5].(int64)}
	if kind == redisstore.KindCompleted {
		r.FreshExpiry, r.TTL2 = v[6].(int64), v[7].(int64)
	}
	return r
}

// fullFromLua maps the twelve values of the full layout to a Record.
func fullFromLua(t *testing.T, v []any) redisstore.Record {
	t.Helper()
	if len(v) != 12 {
		t.Fatalf("%d values, want the 12 of the full layout: %#v", len(v), v)
	}
	return redisstore.Record{
		Kind: v[0].(int64), ID: v[1].(string), Owner: v[2].(string), PayloadHash: v[3].(string),
		Until: v[4].(int64), Lease: v[5].(int64), Attempts: v[6].(int64), FirstSeen: v[7].(int64), LastSeen: v[8].(int64),
		Expiry: v[9].(int64), Reason: v[10].(string), RetryAt: v[11].(int64),
	}
}

// diffRecords compares got and want field by field and names every field
// that differs.
func diffRecords(got, want redisstore.Record) []string {
	var out []string
	g, w := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range g.NumField() {
		if a, b := g.Field(i).Interface(), w.Field(i).Interface(); a != b {
			out = append(out, fmt.Sprintf("%s: got %v, want %v", g.Type().Field(i).Name, trim(a), trim(b)))
		}
	}
	return out
}

func trim(v any) any {
	if s, ok := v.(string); ok && len(s) > 40 {
		return fmt.Sprintf("%q... (%d bytes)", s[:40], len(s))
	}
	return v
}

func checkRecord(t *testing.T, what string, got, want redisstore.Record) {
	t.Helper()
	for _, d := range diffRecords(got, want) {
		t.Errorf("%s: %s", what, d)
	}
}

// redisNow is the Redis clock, in µs.
func redisNow(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMicro()
}

// Records in every layout, encoded by the Go codec, are read by the scripts'
// decode as the same values, and by their load as the Go view says (the
// times of kinds 0 and 3 from the key's PEXPIRETIME).
func TestRecordCodec_go_writes_scripts_read(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	now := redisNow(t, c)
	const hour = int64(time.Hour / time.Microsecond)
	long := strings.Repeat("L", inbox.MaxLeaseIDLen) // str 8
	for _, tc := range []struct {
		name string
		rec  redisstore.Record
		ttl  time.Duration // of the key
	}{
		{"fresh", redisstore.Record{Kind: redisstore.KindFresh, ID: "lease-1", Owner: "me", Lease: 30_000_000, TTL: 3_630_001}, 3_630_001 * time.Millisecond},
		{"fresh long strings", redisstore.Record{Kind: redisstore.KindFresh, ID: long, Owner: strings.Repeat("o", 300), PayloadHash: strings.Repeat("h", 70_000), Lease: 127, TTL: 60_000}, time.Minute},
		{"completed", redisstore.Record{Kind: redisstore.KindCompleted, ID: "lease-1", Owner: "me", PayloadHash: "hash", Lease: 30_000_000, TTL: 3_630_001, FreshExpiry: now/1000 + 3_600_000, TTL2: 3_600_000}, time.Hour},
		{"completed long lease id", redisstore.Record{Kind: redisstore.KindCompleted, ID: long, Lease: 128, TTL: 120_000, FreshExpiry: now/1000 + 100_000, TTL2: 60_000}, time.Minute},
		{"in flight", redisstore.Record{Kind: redisstore.KindHeld, ID: "lease-2", Owner: "me", PayloadHash: "hash", Until: now + 30_000_000, Lease: 30_000_000, Attempts: 2, FirstSeen: now - 5_000_000, LastSeen: now - 1000, Expiry: now + 30_000_000 + hour}, 2 * time.Hour},
		{"backoff", redisstore.Record{Kind: redisstore.KindHeld, Owner: "me", Lease: 30_000_000, Attempts: 3, FirstSeen: now - 5_000_000, LastSeen: now - 1000, Expiry: now + 60_000_000 + hour, Reason: "boom", RetryAt: now + 60_000_000}, 2 * time.Hour},
		{"processed", redisstore.Record{Kind: redisstore.KindProcessed, ID: "lease-2", Owner: "me", Lease: 30_000_000, Attempts: 1, FirstSeen: now - 5_000_000, LastSeen: now - 1000, Expiry: now + hour, Reason: strings.Repeat("r", 40)}, 2 * time.Hour},
		{"dead", redisstore.Record{Kind: redisstore.KindDead, Owner: "me", Lease: 30_000_000, Attempts: 7, FirstSeen: now - 5_000_000, LastSeen: now - 1000, Expiry: now + hour, Reason: "poison"}, 2 * time.Hour},
		{"short released", redisstore.Record{Kind: redisstore.KindHeld, Owner: "me", PayloadHash: "h", Lease: 1000, Attempts: 3, FirstSeen: now - 2000, LastSeen: now - 1000, Expiry: now + hour, Short: true}, 2 * time.Hour},
		{"short processed", redisstore.Record{Kind: redisstore.KindProcessed, ID: "lease-0", Lease: 1000, Attempts: 1, FirstSeen: now - 2000, LastSeen: now - 1000, Expiry: now + hour, Short: true}, 2 * time.Hour},
		{"compact processed", redisstore.Record{Kind: redisstore.KindCompact, ID: redisstore.Fingerprint("lease-3"), PayloadHash: redisstore.CompactHash(strings.Repeat("0f", 32)), Attempts: 2, FirstSeen: now - 5_000_000, LastSeen: now - 1000}, time.Hour},
		{"compact processed, marked", redisstore.Record{Kind: redisstore.KindCompact, FirstSeen: now - 1000, LastSeen: now - 1000}, time.Hour},
		{"compact processed by the short way", redisstore.Record{Kind: redisstore.KindMarked, ID: redisstore.Fingerprint("lease-4"), PayloadHash: redisstore.CompactHash(strings.Repeat("0f", 32)), Attempts: 1, FirstSeen: now - 5_000_000, TTL2: 3_600_000}, time.Hour},
		{"compact dead", redisstore.Record{Kind: redisstore.KindTomb, Owner: "me", PayloadHash: "opaque", Attempts: 7, FirstSeen: now - 5_000_000, LastSeen: now - 1000, Reason: strings.Repeat("r", 300)}, time.Hour},
		{"sha-256 payload hash of an older version", redisstore.Record{Kind: redisstore.KindHeld, ID: "lease-2", Owner: "me", PayloadHash: strings.Repeat("0f", 32), Until: now + 30_000_000, Lease: 30_000_000, Attempts: 2, FirstSeen: now - 5_000_000, LastSeen: now - 1000, Expiry: now + 30_000_000 + hour}, 2 * time.Hour},
		{"expired", redisstore.Record{Kind: redisstore.KindDead, Lease: 1, Attempts: 1, FirstSeen: now - 2000, LastSeen: now - 1000, Expiry: now - 1, Reason: "past"}, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := prefix + tc.name
			b := redisstore.EncodeRecord(tc.rec)
			got, err := redisstore.DecodeRecord(b)
			if err != nil {
				t.Fatalf("DecodeRecord of its own bytes: %v", err)
			}
			checkRecord(t, "Go decode", got, tc.rec)
			if err := c.Set(ctx, key, b, tc.ttl).Err(); err != nil {
				t.Fatal(err)
			}
			lua, err := readLua(t, c, key)
			if err != nil {
				t.Fatal(err)
			}
			if !lua.rawOK {
				t.Fatal("the scripts' decode refused the record")
			}
			want := tc.rec
			want.Short = false // decode reads a short record with rs "" and ra 0
			checkRecord(t, "the scripts' decode", lua.raw, want)
			view, live := redisstore.ViewRecord(tc.rec, lua.expiryMS, lua.now)
			if lua.viewOK != live {
				t.Fatalf("load found a live record: %v; the Go view: %v", lua.viewOK, live)
			}
			checkRecord(t, "the scripts' load", lua.view, view)
			if tc.name == "expired" && live {
				t.Fatal("a record past its logical expiry is live")
			}
		})
	}
}

// Records the scripts write, through the store's operations and through
// save, and the short layout the scripts of older versions wrote, are read
// by the Go decoder as the scripts read them, with the values the
// operations gave.
func TestRecordCodec_scripts_write_go_reads(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	const ret = time.Hour
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: ret})
	const lease = time.Minute
	leaseUS, retUS := lease.Microseconds(), ret.Microseconds()
	claimOpts := func(id string) inbox.BeginOptions {
		return inbox.BeginOptions{LeaseID: id, Owner: "me", PayloadHash: "hash-1", Lease: lease}
	}
	claim := func(t *testing.T, key, id string, want inbox.Status) inbox.Claim {
		t.Helper()
		cl, err := s.TryBegin(ctx, key, claimOpts(id))
		if err != nil || cl.Status != want {
			t.Fatalf("TryBegin(%s, %s) = %+v, %v; want %v", key, id, cl, err, want)
		}
		return cl
	}
	ok := func(t *testing.T, what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// read decodes the key's bytes with the Go codec, checks them field by
	// field against the scripts' decode and the Go view against load, and
	// returns the record and its bytes.
	read := func(t *testing.T, key string) (redisstore.Record, []byte) {
		t.Helper()
		b, err := c.Get(ctx, prefix+key).Bytes()
		if err != nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		got, err := redisstore.DecodeRecord(b)
		if err != nil {
			t.Fatalf("DecodeRecord: %v", err)
		}
		lua, err := readLua(t, c, prefix+key)
		if err != nil {
			t.Fatal(err)
		}
		raw := got
		raw.Short = false
		checkRecord(t, "Go decode against the scripts' decode", raw, lua.raw)
		view, live := redisstore.ViewRecord(got, lua.expiryMS, lua.now)
		if !live || !lua.viewOK {
			t.Fatalf("live: Go view %v, load %v", live, lua.viewOK)
		}
		checkRecord(t, "Go view against the scripts' load", view, lua.view)
		return got, b
	}

	t.Run("completed knowing its claim", func(t *testing.T) {
		cl := claim(t, "completed", "lease-1", inbox.Acquired)
		_, errs, err := redisstore.Apply(ctx, s, []driver.Op{{Kind: driver.Complete, Key: "completed", LeaseID: "lease-1", Owner: "me", PayloadHash: "hash-1", Lease: cl.Lease, ExpiresAt: cl.ExpiresAt}})
		ok(t, "Apply", err)
		ok(t, "Complete", errs[0])
		got, _ := read(t, "completed")
		checkRecord(t, "completed record", got, redisstore.Record{
			Kind: redisstore.KindMarked, ID: redisstore.Fingerprint("lease-1"), PayloadHash: "hash-1",
			Attempts: 1, FirstSeen: cl.ExpiresAt.UnixMicro() - leaseUS, TTL2: ret.Milliseconds(),
		})
	})

	// The full layout, through the life of one key.
	key := "full"
	first := claim(t, key, "lease-1", inbox.Acquired)
	acquired := first.ExpiresAt.UnixMicro() - leaseUS
	steps := []struct {
		name string
		do   func(t *testing.T)
		want func(got redisstore.Record) redisstore.Record // from the times the scripts chose
	}{
		{"in flight (the holder's retry)", func(t *testing.T) { claim(t, key, "lease-1", inbox.Acquired) }, func(g redisstore.Record) redisstore.Record {
			return redisstore.Record{Kind: redisstore.KindHeld, ID: "lease-1", Owner: "me", PayloadHash: "hash-1", Until: g.LastSeen + leaseUS, Lease: leaseUS,
				Attempts: 1, FirstSeen: acquired, LastSeen: g.LastSeen, Expiry: g.LastSeen + leaseUS + retUS}
		}},
		{"released", func(t *testing.T) { ok(t, "Release", s.Release(ctx, key, "lease-1")) }, func(g redisstore.Record) redisstore.Record {
			return redisstore.Record{Kind: redisstore.KindHeld, Owner: "me", PayloadHash: "hash-1", Lease: leaseUS,
				Attempts: 1, FirstSeen: acquired, LastSeen: g.LastSeen, Expiry: g.LastSeen + retUS}
		}},
		{"in a backoff", func(t *testing.T) {
			claim(t, key, "lease-2", inbox.Acquired)
			ok(t, "Fail", s.Fail(ctx, key, "lease-2", inbox.FailOptions{RetryAfter: 10 * time.Minute, Reason: strings.Repeat("boom ", 10)}))
		}, func(g redisstore.Record) redisstore.Record {
			ra := g.LastSeen + (10 * time.Minute).Microseconds()
			return redisstore.Record{Kind: redisstore.KindHeld, Owner: "me", PayloadHash: "hash-1", Lease: leaseUS,
				Attempts: 2, FirstSeen: acquired, LastSeen: g.LastSeen, Expiry: ra + retUS, Reason: strings.Repeat("boom ", 10), RetryAt: ra}
		}},
		{"processed", func(t *testing.T) {
			ok(t, "ForceRelease", s.ForceRelease(ctx, key))
			claim(t, key, "lease-3", inbox.Acquired)
			ok(t, "Complete", s.Complete(ctx, key, "lease-3"))
		}, func(g redisstore.Record) redisstore.Record {
			return redisstore.Record{Kind: redisstore.KindCompact, ID: redisstore.Fingerprint("lease-3"), PayloadHash: "hash-1",
				Attempts: 3, FirstSeen: acquired, LastSeen: g.LastSeen}
		}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.do(t)
			got, _ := read(t, key)
			checkRecord(t, st.name, got, st.want(got))
		})
	}

	t.Run("dead", func(t *testing.T) {
		claim(t, "dead", "lease-1", inbox.Acquired)
		ok(t, "Fail", s.Fail(ctx, "dead", "lease-1", inbox.FailOptions{Dead: true, Reason: "poison"}))
		got, _ := read(t, "dead")
		checkRecord(t, "dead record", got, redisstore.Record{Kind: redisstore.KindTomb, Owner: "me", PayloadHash: "hash-1",
			Attempts: 1, FirstSeen: got.FirstSeen, LastSeen: got.LastSeen, Reason: "poison"})
	})

	t.Run("marked", func(t *testing.T) {
		ok(t, "MarkProcessed", s.MarkProcessed(ctx, "marked"))
		got, _ := read(t, "marked")
		checkRecord(t, "marked record", got, redisstore.Record{Kind: redisstore.KindCompact, FirstSeen: got.LastSeen, LastSeen: got.LastSeen})
	})

	// save writes integers in the smallest format that fits, which the Go
	// writer never uses (it writes positive fixint or uint 64), and strings
	// of every str format.
	t.Run("save, every format", func(t *testing.T) {
		now := redisNow(t, c)
		want := redisstore.Record{
			Kind: redisstore.KindHeld, ID: strings.Repeat("i", 31), Owner: strings.Repeat("o", 255), PayloadHash: strings.Repeat("h", 65_535),
			Until: 200, Lease: 40_000, Attempts: 3_000_000_000, FirstSeen: 0, LastSeen: 127, Expiry: now + retUS,
			Reason: strings.Repeat("r", 65_536), RetryAt: 1 << 40,
		}
		args := []any{"save", want.Kind, want.ID, want.Owner, want.PayloadHash, want.Until, want.Lease, want.Attempts,
			want.FirstSeen, want.LastSeen, want.Expiry, want.Reason, want.RetryAt}
		ok(t, "save", redisstore.CodecScript.Run(ctx, c, []string{prefix + "saved"}, args...).Err())
		got, b := read(t, "saved")
		checkRecord(t, "saved record", got, want)
		for _, f := range []struct {
			name string
			b    []byte
		}{
			{"uint 8", []byte{0xcc, 200}}, {"uint 16", []byte{0xcd, 0x9c, 0x40}}, {"uint 32", []byte{0xce, 0xb2, 0xd0, 0x5e, 0x00}},
			{"uint 64", []byte{0xcf, 0, 0, 1, 0, 0, 0, 0, 0}}, {"str 8", []byte{0xd9, 255}}, {"str 16", []byte{0xda, 0xff, 0xff}},
			{"str 32", []byte{0xdb, 0, 1, 0, 0}},
		} {
			if !bytes.Contains(b, f.b) {
				t.Errorf("save wrote no %s (% x) in a record that needs one", f.name, f.b)
			}
		}
	})

	// The short layout, as the scripts before Fail existed wrote it: their
	// save, verbatim.
	t.Run("short, by older scripts", func(t *testing.T) {
		const oldSave = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local k = KEYS[1]
local function save(kind, id, ow, ph, lu, ln, at, fs, ls, ex)
  redis.call('SET', k, cmsgpack.pack(kind, id, ow, ph, lu, ln, at, fs, ls, ex), 'PX', string.format('%d', math.ceil((ex - now) / 1000) + 1))
end
save(tonumber(ARGV[1]), '', 'me', 'hash-1', 0, 30000000, 3, now - 2000, now, now + tonumber(ARGV[2]))
return now
`
		for _, kind := range []int64{redisstore.KindHeld, redisstore.KindProcessed} {
			now, err := redis.NewScript(oldSave).Run(ctx, c, []string{prefix + "short"}, kind, retUS).Int64()
			ok(t, "the older save", err)
			got, _ := read(t, "short")
			checkRecord(t, fmt.Sprintf("short record of kind %d", kind), got, redisstore.Record{Kind: kind, Owner: "me", PayloadHash: "hash-1", Lease: 30_000_000,
				Attempts: 3, FirstSeen: now - 2000, LastSeen: now, Expiry: now + retUS, Short: true})
		}
	})
}

// Bytes that are no record of a known layout: the Go decoder refuses them
// with ErrRecord, the scripts' decode returns nothing and load fails naming
// the record (or, for a value cut short, cmsgpack.unpack fails).
func TestRecordCodec_both_refuse(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	full := redisstore.Record{Kind: redisstore.KindHeld, ID: "l", Lease: 1, Attempts: 1, FirstSeen: 1, LastSeen: 1, Expiry: 1 << 60}
	enc := redisstore.EncodeRecord
	with := func(r redisstore.Record, f func(*redisstore.Record)) redisstore.Record { f(&r); return r }
	fresh := enc(redisstore.Record{Kind: redisstore.KindFresh, ID: "l", Lease: 1, TTL: 1})
	completed := enc(redisstore.Record{Kind: redisstore.KindCompleted, ID: "l", Lease: 1, TTL: 1, FreshExpiry: 1, TTL2: 1})
	compact := enc(redisstore.Record{Kind: redisstore.KindCompact, ID: "12345678", Attempts: 1, FirstSeen: 1, LastSeen: 1})
	tomb := enc(redisstore.Record{Kind: redisstore.KindTomb, Owner: "o", Reason: "r", Attempts: 1, FirstSeen: 1, LastSeen: 1})
	for _, tc := range []struct {
		name string
		b    []byte
		cut  bool // cmsgpack.unpack fails
	}{
		{"empty", nil, false},
		{"unknown kind", enc(with(full, func(r *redisstore.Record) { r.Kind = 8 })), false},
		{"fresh with a value more", append(fresh[:len(fresh):len(fresh)], 1), false},
		{"completed without ttl2", completed[:len(completed)-1], false},
		{"full without ra", append(enc(with(full, func(r *redisstore.Record) { r.Short = true })), 0xa0), false},
		{"full with a value more", append(enc(full), 0), false},
		{"compact without the fingerprint", compact[:len(compact)-9], false},
		{"compact with a value more", append(compact[:len(compact):len(compact)], 0), false},
		{"compact dead without the reason", tomb[:len(tomb)-2], false},
		{"compact with a string for the attempts", append([]byte{5, 0xa1, 'x'}, compact[2:]...), false},
		{"dead in the short layout", enc(with(full, func(r *redisstore.Record) { r.Kind, r.Short = redisstore.KindDead, true })), false},
		{"a number for the lease id", append([]byte{1, 7}, enc(full)[3:]...), false},
		{"a string for the lease", append(enc(redisstore.Record{Kind: redisstore.KindFresh, ID: "l"})[:5], 0xa1, 'x', 1), false},
		{"a string cut short", []byte{0, 0xa5, 'l'}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := redisstore.DecodeRecord(tc.b); !errors.Is(err, redisstore.ErrRecord) {
				t.Errorf("DecodeRecord = %v, want ErrRecord", err)
			}
			key := prefix + tc.name
			if err := c.Set(ctx, key, tc.b, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			_, err := readLua(t, c, key)
			want := fmt.Sprintf("unexpected record of %d bytes under %s", len(tc.b), key)
			if tc.cut {
				want = "Missing bytes in input"
			}
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("the scripts' load = %v, want an error %q", err, want)
			}
		})
	}
}
