package storetest

import (
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox"
)

// roundTrip acquires, checks, completes and re-reads key, proving the store
// keeps it exactly.
func roundTrip(t *testing.T, st inbox.LeaseStore, key string) {
	t.Helper()
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if r := mustGet(t, st, key); r.State != inbox.StateInProgress {
		t.Fatalf("key %q: Get after TryBegin = %v, want InProgress", key, r.State)
	}
	if err := st.Complete(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatalf("key %q: Complete: %v", key, err)
	}
	mustBegin(t, st, key, inbox.BeginOptions{}, inbox.Processed)
	if ok, err := st.IsProcessed(ctxT(t), key); err != nil || !ok {
		t.Fatalf("key %q: IsProcessed after Complete = %v, %v", key, ok, err)
	}
	if r := mustGet(t, st, key); r.State != inbox.StateProcessed {
		t.Fatalf("key %q: Get after Complete = %v, want Processed", key, r.State)
	}
}

func (s *suite) testSpecialKeys(t *testing.T) {
	st := s.store(t)
	base := newKey(t, "")
	suffixes := []string{
		"bus:group:alias:urn:uuid:6ba7b810-9dad-11d1-80b4-00c04fd430c8",
		"100%", "%3A%25", "%", "%zz", "a%2Fb",
		"/leading/slash", "trailing/", "a//b", "a/./b", "a/../b", "../up", "./here",
		"?query=1&x", "#fragment", "sp ace", "+plus", "back\\slash", `"quoted"`, "<>{}|^`",
		"tab\there", "new\nline", "\r\n", "\x01\x1f\x7f",
		"ключ", "键", "🔑🔐", "e\u0301", "\u00e9", "\ufeffbom",
	}
	for _, sfx := range suffixes {
		roundTrip(t, st, base+sfx)
	}
	// Whole keys that are path segments of their own. Each run of the suite
	// gets a fresh store (Harness.New), so these fixed keys are new here.
	for _, k := range []string{".", "..", "...", "/", "%2e%2e", "%", "?", "#"} {
		if r := mustGet(t, st, k); r.State != inbox.StateNotFound {
			t.Fatalf("bare key %q already exists: Harness.New must return a store without keys from earlier runs", k)
		}
		roundTrip(t, st, k)
	}
}

func (s *suite) testKeysByteForByte(t *testing.T) {
	st := s.store(t)
	base := newKey(t, "")
	// Pairs that a case- or accent-insensitive, space-padding or Unicode
	// normalising comparison would fold together.
	groups := [][]string{
		{"ABC", "abc", "abc ", "abc  ", " abc", "Abc"},
		{"\u00e9", "e\u0301", "E\u0301", "\u00c9"},
		{"ß", "ss", "SS", "ẞ"},
		{"a", "a\t", "a\u00a0", "ａ"},
	}
	for _, g := range groups {
		c := mustBegin(t, st, base+g[0], inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
		if err := st.Complete(ctxT(t), base+g[0], c.LeaseID); err != nil {
			t.Fatalf("Complete(%q): %v", base+g[0], err)
		}
		for _, other := range g[1:] {
			k := base + other
			if r := mustGet(t, st, k); r.State != inbox.StateNotFound {
				t.Fatalf("key %q is seen as %v after only %q was completed: keys must compare byte for byte", other, r.State, g[0])
			}
			mustBegin(t, st, k, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
		}
		mustBegin(t, st, base+g[0], inbox.BeginOptions{}, inbox.Processed)
	}
}

func (s *suite) testKeyMaxLength(t *testing.T) {
	st := s.store(t)
	base := newKey(t, "")
	// Multi-byte runes so a store that counts characters, not bytes, shows.
	body := base + strings.Repeat("é", (inbox.MaxKeyLen-len(base))/2)
	longA := body + strings.Repeat("a", inbox.MaxKeyLen-len(body))
	longB := longA[:len(longA)-1] + "b"
	if len(longA) != inbox.MaxKeyLen || len(longB) != inbox.MaxKeyLen {
		t.Fatalf("test bug: key lengths %d, %d", len(longA), len(longB))
	}
	roundTrip(t, st, longA)
	// Differs only in its last byte: a store that truncates or indexes a
	// prefix would see a duplicate.
	if r := mustGet(t, st, longB); r.State != inbox.StateNotFound {
		t.Fatalf("a %d-byte key differing only in its last byte is seen as %v", inbox.MaxKeyLen, r.State)
	}
	roundTrip(t, st, longB)

	tooLong := longA + "x"
	_, err := st.TryBegin(ctxT(t), tooLong, inbox.BeginOptions{})
	wantErr(t, "TryBegin with a key of MaxKeyLen+1 bytes", err, inbox.ErrInvalidKey)
}
