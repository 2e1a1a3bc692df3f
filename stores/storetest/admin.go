package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
)

// The operators' side (inbox.Admin): List, Forget, ForceRelease.

// admin returns the store as an inbox.Admin, or skips: a store states the
// capability by implementing the interface.
func (s *suite) admin(t *testing.T, st inbox.LeaseStore) inbox.Admin {
	t.Helper()
	a, ok := st.(inbox.Admin)
	if !ok {
		t.Skipf("the store (%T) does not implement inbox.Admin", st)
	}
	return a
}

// listAll pages through List with opts until Next is empty, and checks
// that every record comes after the one before it, in key order across the
// pages.
func listAll(t *testing.T, a inbox.Admin, opts inbox.ListOptions) []inbox.ListItem {
	t.Helper()
	var all []inbox.ListItem
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("List: more than 1000 pages; is Next advancing?")
		}
		p, err := a.List(ctxT(t), opts)
		if err != nil {
			t.Fatalf("List(%+v): %v", opts, err)
		}
		if opts.Limit > 0 && len(p.Items) > opts.Limit {
			t.Fatalf("List returned %d items, over the limit of %d", len(p.Items), opts.Limit)
		}
		for _, it := range p.Items {
			if len(all) > 0 && it.Key <= all[len(all)-1].Key {
				t.Fatalf("List(%+v) returned %q after %q: not in key order", opts, it.Key, all[len(all)-1].Key)
			}
			all = append(all, it)
		}
		if p.Next == "" {
			return all
		}
		opts.Cursor = p.Next
	}
}

func keysOf(items []inbox.ListItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.Key
	}
	return out
}

// adminFixture makes, under a prefix of its own, one key in each state:
// available (released), in-progress, processed, dead, and one in a backoff.
func adminFixture(t *testing.T, st inbox.LeaseStore) (prefix string, keys map[inbox.State][]string) {
	t.Helper()
	prefix = newKey(t, "admin:")
	keys = map[inbox.State][]string{}
	claim := func(k string) inbox.Claim {
		return mustBegin(t, st, k, inbox.BeginOptions{Lease: longLease, Owner: "fixture"}, inbox.Acquired)
	}
	k := prefix + "a-released"
	if err := st.Release(ctxT(t), k, claim(k).LeaseID); err != nil {
		t.Fatal(err)
	}
	keys[inbox.StateAvailable] = append(keys[inbox.StateAvailable], k)
	k = prefix + "b-backoff"
	if err := st.Fail(ctxT(t), k, claim(k).LeaseID, inbox.FailOptions{RetryAfter: time.Hour, Reason: "later"}); err != nil {
		t.Fatal(err)
	}
	keys[inbox.StateAvailable] = append(keys[inbox.StateAvailable], k)
	k = prefix + "c-in-progress"
	claim(k)
	keys[inbox.StateInProgress] = []string{k}
	k = prefix + "d-processed"
	if err := st.Complete(ctxT(t), k, claim(k).LeaseID); err != nil {
		t.Fatal(err)
	}
	keys[inbox.StateProcessed] = []string{k}
	k = prefix + "e-dead"
	if err := st.Fail(ctxT(t), k, claim(k).LeaseID, inbox.FailOptions{Dead: true, Reason: "poison"}); err != nil {
		t.Fatal(err)
	}
	keys[inbox.StateDead] = []string{k}
	return prefix, keys
}

func (s *suite) testListFilters(t *testing.T) {
	st := s.store(t)
	a := s.admin(t, st)
	prefix, keys := adminFixture(t, st)
	var want []string
	for _, ks := range keys {
		want = append(want, ks...)
	}
	slices.Sort(want)
	all := listAll(t, a, inbox.ListOptions{Prefix: prefix})
	if got := keysOf(all); !slices.Equal(got, want) {
		t.Fatalf("List(prefix) = %q, want %q in key order", got, want)
	}
	for _, it := range all {
		r := mustGet(t, st, it.Key)
		if !s.sameRecord(it.Record, r) {
			t.Errorf("List's record of %q = %+v, Get says %+v", it.Key, it.Record, r)
		}
	}
	for state, ks := range keys {
		got := keysOf(listAll(t, a, inbox.ListOptions{Prefix: prefix, State: state}))
		if !slices.Equal(got, ks) {
			t.Errorf("List(state %v) = %q, want %q", state, got, ks)
		}
	}
	dead := listAll(t, a, inbox.ListOptions{Prefix: prefix, State: inbox.StateDead})
	if len(dead) != 1 || dead[0].Reason != "poison" || dead[0].Attempts != 1 {
		t.Fatalf("dead keys listed as %+v, want one with its reason and attempts", dead)
	}
	if got := listAll(t, a, inbox.ListOptions{Prefix: prefix, OlderThan: time.Hour}); len(got) != 0 {
		t.Fatalf("List(older than 1h) = %q, want none (all were just written)", keysOf(got))
	}
	age := 2 * s.h.Lease
	pollUntil(t, expireDeadline(age), "the fixture to be listed as older than "+age.String(), func() bool {
		return len(keysOf(listAll(t, a, inbox.ListOptions{Prefix: prefix, OlderThan: age}))) == len(want)
	})
	if got := listAll(t, a, inbox.ListOptions{Prefix: prefix + "zzz"}); len(got) != 0 {
		t.Fatalf("List of an unused prefix = %q, want none", keysOf(got))
	}
}

func (s *suite) testListPages(t *testing.T) {
	st := s.store(t)
	a := s.admin(t, st)
	prefix := newKey(t, "pages:")
	var want []string
	for i := range 7 {
		k := prefix + string(rune('a'+i))
		if err := st.MarkProcessed(ctxT(t), k); err != nil {
			t.Fatal(err)
		}
		want = append(want, k)
	}
	got := listAll(t, a, inbox.ListOptions{Prefix: prefix, Limit: 2})
	if !slices.Equal(keysOf(got), want) {
		t.Fatalf("paged List = %q, want %q once each, in order", keysOf(got), want)
	}
}

func (s *suite) testForget(t *testing.T) {
	st := s.store(t)
	a := s.admin(t, st)
	prefix, keys := adminFixture(t, st)
	for _, k := range []string{keys[inbox.StateProcessed][0], keys[inbox.StateDead][0], keys[inbox.StateAvailable][1]} {
		if err := a.Forget(ctxT(t), k); err != nil {
			t.Fatalf("Forget(%q): %v", k, err)
		}
		if r := mustGet(t, st, k); r.State != inbox.StateNotFound {
			t.Fatalf("after Forget(%q): %+v, want NotFound", k, r)
		}
		if c := mustBegin(t, st, k, inbox.BeginOptions{Lease: longLease}, inbox.Acquired); c.Attempts != 1 {
			t.Fatalf("claim after Forget(%q): Attempts %d, want 1 (a new record)", k, c.Attempts)
		}
	}
	if err := a.Forget(ctxT(t), prefix+"never-seen"); err != nil {
		t.Fatalf("Forget of an unknown key: %v", err)
	}
}

func (s *suite) testForceRelease(t *testing.T) {
	st := s.store(t)
	a := s.admin(t, st)
	_, keys := adminFixture(t, st)
	held := keys[inbox.StateInProgress][0]
	if b := mustBegin(t, st, held, inbox.BeginOptions{Lease: longLease}, inbox.Busy); b.BackingOff {
		t.Fatalf("claim of a held key before ForceRelease: %+v, want Busy, not BackingOff", b)
	}
	old := mustGet(t, st, held)
	if err := a.ForceRelease(ctxT(t), held); err != nil {
		t.Fatalf("ForceRelease of a live lease: %v", err)
	}
	if r := mustGet(t, st, held); r.State != inbox.StateAvailable || r.Attempts != old.Attempts {
		t.Fatalf("after ForceRelease: %+v, want Available with the attempts kept", r)
	}
	c := mustBegin(t, st, held, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if c.Attempts != old.Attempts+1 {
		t.Fatalf("claim after ForceRelease: Attempts %d, want %d", c.Attempts, old.Attempts+1)
	}
	backoff := keys[inbox.StateAvailable][1]
	if b := mustBegin(t, st, backoff, inbox.BeginOptions{Lease: longLease}, inbox.Busy); !b.BackingOff {
		t.Fatalf("claim of a key in backoff before ForceRelease: %+v, want Busy and BackingOff", b)
	}
	if err := a.ForceRelease(ctxT(t), backoff); err != nil {
		t.Fatalf("ForceRelease of a backoff: %v", err)
	}
	if c := mustBegin(t, st, backoff, inbox.BeginOptions{Lease: longLease}, inbox.Acquired); c.BackingOff {
		t.Fatalf("claim after ForceRelease of a backoff: %+v, not BackingOff", c)
	}
	for _, k := range []string{keys[inbox.StateProcessed][0], keys[inbox.StateDead][0]} {
		before := mustGet(t, st, k)
		if err := a.ForceRelease(ctxT(t), k); err != nil {
			t.Fatalf("ForceRelease(%q): %v", k, err)
		}
		if r := mustGet(t, st, k); r.State != before.State {
			t.Fatalf("ForceRelease changed %v key %q to %v", before.State, k, r.State)
		}
	}
	if err := a.ForceRelease(ctxT(t), newKey(t, "never-seen")); err != nil {
		t.Fatalf("ForceRelease of an unknown key: %v", err)
	}
	// The old holder is fenced off.
	k := newKey(t, "forced")
	c0 := mustBegin(t, st, k, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if err := a.ForceRelease(ctxT(t), k); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "Complete by the forcibly released holder", st.Complete(ctxT(t), k, c0.LeaseID), inbox.ErrLeaseLost)
	wantErr(t, "Release by the forcibly released holder", st.Release(ctxT(t), k, c0.LeaseID), inbox.ErrLeaseLost)
}

// testListKeyOrder: List returns the records in key order, byte for byte,
// across pages: the first page holds the smallest keys, and each page
// starts after the last key of the one before. Keys that collations order
// otherwise (case, spaces, punctuation, non-ASCII) are among them; so are
// a state that few records are in and a page limit that cuts the listing
// anywhere.
func (s *suite) testListKeyOrder(t *testing.T) {
	st := s.store(t)
	a := s.admin(t, st)
	prefix := newKey(t, "order:")
	suffixes := []string{"", "B", "a", "A", "a b", "a-b", "ab", "aB", "a\x01", "é", "z", "~", "Z", "0", "_", "ÿ", "日本"}
	for i := 1; i <= 40; i++ {
		suffixes = append(suffixes, fmt.Sprintf("k%03d", i))
	}
	var want, held []string
	for i, sfx := range suffixes {
		k := prefix + sfx
		if i%7 == 3 { // a few in progress, for a filter few records pass
			mustBegin(t, st, k, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
			held = append(held, k)
		} else if err := st.MarkProcessed(ctxT(t), k); err != nil {
			t.Fatal(err)
		}
		want = append(want, k)
	}
	slices.Sort(want)
	slices.Sort(held)

	first, err := a.List(ctxT(t), inbox.ListOptions{Prefix: prefix, Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(first.Items); !slices.Equal(got, want[:5]) || first.Next == "" {
		t.Fatalf("List(limit 5) = %q (next %q), want the 5 smallest keys %q and a cursor", got, first.Next, want[:5])
	}
	for _, limit := range []int{1, 3, 7, 1000} {
		got := listAll(t, a, inbox.ListOptions{Prefix: prefix, Limit: limit})
		if ks := keysOf(got); !slices.Equal(ks, want) {
			t.Fatalf("List by pages of %d = %q, want each key once in byte order: %q", limit, ks, want)
		}
		got = listAll(t, a, inbox.ListOptions{Prefix: prefix, Limit: limit, State: inbox.StateInProgress})
		if ks := keysOf(got); !slices.Equal(ks, held) {
			t.Fatalf("List(in progress) by pages of %d = %q, want %q", limit, ks, held)
		}
	}
}
