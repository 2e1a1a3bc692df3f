package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
)

// call is one store call made with bad input.
type call struct {
	name string
	do   func(ctx context.Context) error
	want error
}

func badKeyCalls(st inbox.LeaseStore, key string) []call {
	id := inbox.NewLeaseID()
	return []call{
		{"TryBegin", func(ctx context.Context) error { _, err := st.TryBegin(ctx, key, inbox.BeginOptions{}); return err }, inbox.ErrInvalidKey},
		{"Complete", func(ctx context.Context) error { return st.Complete(ctx, key, id) }, inbox.ErrInvalidKey},
		{"Release", func(ctx context.Context) error { return st.Release(ctx, key, id) }, inbox.ErrInvalidKey},
		{"Extend", func(ctx context.Context) error { _, err := st.Extend(ctx, key, id, longLease); return err }, inbox.ErrInvalidKey},
		{"Get", func(ctx context.Context) error { _, err := st.Get(ctx, key); return err }, inbox.ErrInvalidKey},
		{"IsProcessed", func(ctx context.Context) error { _, err := st.IsProcessed(ctx, key); return err }, inbox.ErrInvalidKey},
		{"MarkProcessed", func(ctx context.Context) error { return st.MarkProcessed(ctx, key) }, inbox.ErrInvalidKey},
		{"Fail", func(ctx context.Context) error { return st.Fail(ctx, key, id, inbox.FailOptions{}) }, inbox.ErrInvalidKey},
	}
}

func (s *suite) checkCalls(t *testing.T, what string, calls []call) {
	t.Helper()
	for _, c := range calls {
		err := c.do(ctxT(t))
		if c.name == "Extend" && s.h.NoExtend && errors.Is(err, inbox.ErrNotSupported) {
			continue
		}
		if !errors.Is(err, c.want) || !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("%s with %s: error %v, want one wrapping %v and ErrInvalidArgument", c.name, what, err, c.want)
		}
		if err != nil && len(err.Error()) < len("inbox: invalid argument: ")+8 {
			t.Errorf("%s with %s: error %q does not say what was wrong", c.name, what, err)
		}
	}
}

func (s *suite) testBadInput(t *testing.T) {
	st := s.store(t)
	base := newKey(t, "")
	for what, key := range map[string]string{
		"an empty key":             "",
		"a key over MaxKeyLen":     base + strings.Repeat("k", inbox.MaxKeyLen),
		"a key of invalid UTF-8":   base + "\xff\xfe",
		"a key holding a NUL byte": base + "a\x00b",
	} {
		s.checkCalls(t, what, badKeyCalls(st, key))
	}
	// Nothing was created under the valid prefixes of those keys.
	for _, k := range []string{base + "a", base} {
		if r := mustGet(t, st, k); r.State != inbox.StateNotFound {
			t.Fatalf("bad input created a record for %q: %+v", k, r)
		}
	}

	// Bad leases and lease ids on a key that has a live lease.
	key := base + "held"
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, Owner: "holder"}, inbox.Acquired)
	before := mustGet(t, st, key)
	fresh := base + "fresh"
	s.checkCalls(t, "bad lease input", []call{
		{"TryBegin negative lease", func(ctx context.Context) error {
			_, err := st.TryBegin(ctx, fresh, inbox.BeginOptions{Lease: -time.Second})
			return err
		}, inbox.ErrInvalidLease},
		{"TryBegin over-long lease id", func(ctx context.Context) error {
			_, err := st.TryBegin(ctx, fresh, inbox.BeginOptions{LeaseID: strings.Repeat("i", inbox.MaxLeaseIDLen+1)})
			return err
		}, inbox.ErrInvalidLeaseID},
		{"TryBegin over-long owner", func(ctx context.Context) error {
			_, err := st.TryBegin(ctx, fresh, inbox.BeginOptions{Owner: strings.Repeat("o", inbox.MaxOwnerLen+1)})
			return err
		}, inbox.ErrInvalidArgument},
		{"TryBegin over-long payload hash", func(ctx context.Context) error {
			_, err := st.TryBegin(ctx, fresh, inbox.BeginOptions{PayloadHash: strings.Repeat("h", inbox.MaxPayloadHashLen+1)})
			return err
		}, inbox.ErrInvalidArgument},
		{"Complete empty lease id", func(ctx context.Context) error { return st.Complete(ctx, key, "") }, inbox.ErrInvalidLeaseID},
		{"Release empty lease id", func(ctx context.Context) error { return st.Release(ctx, key, "") }, inbox.ErrInvalidLeaseID},
		{"Extend", func(ctx context.Context) error { _, err := st.Extend(ctx, key, "", longLease); return err }, inbox.ErrInvalidLeaseID},
		{"Extend", func(ctx context.Context) error { _, err := st.Extend(ctx, key, c.LeaseID, 0); return err }, inbox.ErrInvalidLease},
		{"Extend", func(ctx context.Context) error { _, err := st.Extend(ctx, key, c.LeaseID, -time.Second); return err }, inbox.ErrInvalidLease},
		{"Fail empty lease id", func(ctx context.Context) error { return st.Fail(ctx, key, "", inbox.FailOptions{}) }, inbox.ErrInvalidLeaseID},
		{"Fail negative backoff", func(ctx context.Context) error {
			return st.Fail(ctx, key, c.LeaseID, inbox.FailOptions{RetryAfter: -time.Second})
		}, inbox.ErrInvalidArgument},
		{"Fail over-long reason", func(ctx context.Context) error {
			return st.Fail(ctx, key, c.LeaseID, inbox.FailOptions{Reason: strings.Repeat("r", inbox.MaxReasonLen+1)})
		}, inbox.ErrInvalidArgument},
	})
	if r := mustGet(t, st, fresh); r.State != inbox.StateNotFound {
		t.Fatalf("a refused TryBegin created a record: %+v", r)
	}
	if after := mustGet(t, st, key); !s.sameRecord(after, before) {
		t.Fatalf("refused calls changed the held key:\n got %+v\nwant %+v", after, before)
	}
	if err := st.Complete(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatalf("the holder's Complete after the refused calls: %v", err)
	}
}

func (s *suite) testCanceledContext(t *testing.T) {
	st := s.store(t)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	base := newKey(t, "")

	fresh := base + "fresh"
	key := base + "held"
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	before := mustGet(t, st, key)

	calls := map[string]func() error{
		"TryBegin": func() error { _, err := st.TryBegin(canceled, fresh, inbox.BeginOptions{}); return err },
		"TryBegin on the held key": func() error {
			_, err := st.TryBegin(canceled, key, inbox.BeginOptions{LeaseID: c.LeaseID})
			return err
		},
		"Complete":      func() error { return st.Complete(canceled, key, c.LeaseID) },
		"Release":       func() error { return st.Release(canceled, key, c.LeaseID) },
		"Extend":        func() error { _, err := st.Extend(canceled, key, c.LeaseID, 2*longLease); return err },
		"Get":           func() error { _, err := st.Get(canceled, key); return err },
		"IsProcessed":   func() error { _, err := st.IsProcessed(canceled, key); return err },
		"MarkProcessed": func() error { return st.MarkProcessed(canceled, key) },
		"Fail":          func() error { return st.Fail(canceled, key, c.LeaseID, inbox.FailOptions{Dead: true}) },
	}
	for name, f := range calls {
		err := f()
		if name == "Extend" && s.h.NoExtend && errors.Is(err, inbox.ErrNotSupported) {
			continue
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a canceled context: error %v, want one wrapping context.Canceled", name, err)
		}
	}
	if r := mustGet(t, st, fresh); r.State != inbox.StateNotFound {
		t.Fatalf("TryBegin with a canceled context created a record: %+v", r)
	}
	if after := mustGet(t, st, key); !s.sameRecord(after, before) {
		t.Fatalf("calls with a canceled context changed the record:\n got %+v\nwant %+v", after, before)
	}
}
