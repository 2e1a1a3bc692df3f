// Package storetest is the conformance suite of the inbox store contract. Every
// store this project ships runs it against its real server, and so can any
// third-party [inbox.LeaseStore]:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{
//			New: func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
//				s, err := mystore.New(mystore.Options{Retention: cfg.Retention})
//				if err != nil {
//					t.Fatal(err)
//				}
//				t.Cleanup(func() { s.Close() })
//				return s
//			},
//		})
//	}
//
// Each behaviour is one subtest, so a failure names the rule that broke.
// Every subtest uses keys of its own (a random prefix), so stores may share one
// backend between subtests, and subtests run in parallel. Leases and
// retention are short (under two seconds by default), so the suite takes
// seconds; the expiry cases poll with a deadline instead of sleeping.
//
// A store states what it cannot do in the [Harness] (River's style): a case
// that needs a missing capability is skipped with the reason, never passed in
// silence.
//
// Stores that batch round trips (see package
// github.com/watermill-inbox/inbox/stores/driver) are held to the same
// contract per call: the concurrency cases release dozens of calls at once,
// so that on such a store they travel in one batch, and check every call's
// own result. The fault cases need a link to break: a store with a server
// gives it through [Harness.Faults], typically a TCP proxy between the store
// and its server:
//
//	h.Faults = func(t *testing.T, cfg storetest.Config) (inbox.LeaseStore, storetest.Link) {
//		p := newProxy(t, serverAddr) // forwards a loopback port to the server
//		s := newStoreAt(t, p.Addr(), cfg)
//		return s, p // p has Cut, Restore and Delay
//	}
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
)

// Harness describes the store under test.
type Harness struct {
	// New returns a store for one subtest, configured with cfg. Required. It
	// may return the same store, or stores sharing one backend, to several
	// subtests when their Config is equal: subtests never share keys. The
	// stores of one Run must not hold keys written by an earlier Run (use a
	// fresh key prefix, table or database per Run, or clear it first): one
	// case uses fixed keys such as "." and "..". New should register its own
	// cleanup with t.Cleanup.
	New func(t *testing.T, cfg Config) inbox.LeaseStore

	// Lease is the short lease the expiry cases use. Default 500ms; a store
	// whose leases have a coarser unit sets it (the remote protocol counts
	// whole seconds, so its harness uses 1s).
	Lease time.Duration

	// Retention is the short retention the retention cases configure through
	// Config. Default 1s.
	Retention time.Duration

	// TimePrecision is the finest unit the store keeps times in: the suite
	// compares store times with this tolerance. Default 1ms.
	TimePrecision time.Duration

	// NoExtend states that the store cannot extend leases: Extend must then
	// fail with inbox.ErrNotSupported, and the cases that need Extend skip.
	NoExtend bool

	// NotAtomic, when not empty, states why the store's claims are not atomic
	// under concurrency on the server under test (for example a MongoDB
	// protocol server whose concurrent updates race). The concurrency cases
	// then skip with this reason.
	NotAtomic string

	// Faults, when set, returns a store for one subtest, configured with
	// cfg, whose link to its backend (a server, a database, a service) the
	// suite can break, and that link. Optional: the fault cases skip
	// without it (an in-process store has no link to break). The link
	// must be the store's own: breaking it must not disturb other subtests.
	// A fault case makes up to FaultCallers calls at once on the store.
	Faults func(t *testing.T, cfg Config) (inbox.LeaseStore, Link)

	// FaultCallers is how many callers the case of a link cut under load
	// runs at once, each claiming and finishing keys of its own; it wants
	// four calls of each to succeed within 30 s before the cut, and each
	// to finish a key within 30 s plus twice the CallTimeout after the
	// link is restored. Default 64; a server that serves a few calls a
	// second (FerretDB in-process under the race detector) asks for
	// fewer.
	FaultCallers int

	// CallTimeout is how long one call of a store that Faults returns may
	// take while its link is cut or slowed: its own per-call bound, the
	// retries it makes within the call included. The fault cases fail a
	// call that takes longer (plus a margin for a loaded machine). Calls
	// must succeed over a link that holds every byte 300ms (a round trip
	// of at least 600ms), so the bound must allow a call the few round
	// trips it makes and a new connection's handshake. Default 10s.
	CallTimeout time.Duration
}

// Link is the connection between a store that [Harness.Faults] returns and
// its backend.
type Link interface {
	// Cut breaks the link: the open connections are closed and new ones
	// refused, so that calls in flight and later calls fail as on a
	// network failure.
	Cut()
	// Restore puts the link back as it was before any fault: connections
	// are accepted and bytes forwarded at once.
	Restore()
}

// SlowLink is a [Link] that can also slow down. The case of calls canceled
// while they wait for a round trip needs it and skips on a Link that is not
// a SlowLink.
type SlowLink interface {
	Link
	// Delay makes the link hold every byte it carries, both ways, for d
	// before it passes it on (latency, not a bandwidth limit: pipelined
	// bytes still flow together), so that a round trip takes at least 2*d
	// longer. Zero forwards at once again; so does Restore.
	Delay(d time.Duration)
}

// Config is what the suite asks of the store [Harness.New] returns.
type Config struct {
	// Retention is how long processed keys must stay processed. Zero means
	// the store's default (the suite then never waits for expiry).
	Retention time.Duration
}

// Run runs the whole suite against h.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("storetest: Harness.New is required")
	}
	if h.Lease <= 0 {
		h.Lease = 500 * time.Millisecond
	}
	if h.Retention <= 0 {
		h.Retention = time.Second
	}
	if h.TimePrecision <= 0 {
		h.TimePrecision = time.Millisecond
	}
	if h.CallTimeout <= 0 {
		h.CallTimeout = 10 * time.Second
	}
	if h.FaultCallers <= 0 {
		h.FaultCallers = racers
	}
	s := &suite{h: h}
	for _, c := range s.cases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t)
		})
	}
}

type testCase struct {
	name string
	fn   func(t *testing.T)
}

type suite struct {
	h Harness
}

func (s *suite) cases() []testCase {
	return []testCase{
		{"TryBegin_new_key_acquires", s.testNewKeyAcquires},
		{"TryBegin_generates_lease_id_when_none_given", s.testGeneratedLeaseID},
		{"TryBegin_concurrent_exactly_one_acquires", s.testConcurrentExactlyOne},
		{"TryBegin_concurrent_on_expired_lease_exactly_one_acquires", s.testConcurrentOnExpired},
		{"TryBegin_concurrent_after_release_exactly_one_acquires", s.testConcurrentAfterRelease},
		{"TryBegin_concurrent_new_busy_processed_keys_each_get_their_status", s.testConcurrentMixedKeys},
		{"TryBegin_concurrent_retries_of_two_leases_one_lease_acquires", s.testConcurrentSameLeaseID},
		{"Concurrent_calls_of_every_kind_each_get_their_result", s.testConcurrentMixedCalls},
		{"Release_and_TryBegin_concurrent_agree_with_the_record", s.testReleaseClaimRace},
		{"Faults_link_cut_under_load_fails_calls_cleanly", s.testLinkCut},
		{"Faults_caller_canceled_while_waiting_gets_its_error", s.testCanceledWhileWaiting},
		{"Faults_unanswered_calls_fail_within_the_store_bound", s.testUnansweredCalls},
		{"TryBegin_busy_reports_deadline_and_retry_after", s.testBusyFields},
		{"TryBegin_same_lease_id_is_idempotent", s.testSameLeaseIDIdempotent},
		{"TryBegin_after_complete_is_processed", s.testProcessedAfterComplete},
		{"TryBegin_default_lease_when_zero", s.testDefaultLease},
		{"Lease_expiry_reacquire_and_fencing", s.testLeaseExpiryFencing},
		{"Complete_after_expiry_when_nobody_took_over", s.testCompleteAfterExpiryUntaken},
		{"Complete_repeated_with_completing_lease", s.testCompleteRepeated},
		{"Complete_with_foreign_lease_is_lease_lost", s.testCompleteForeign},
		{"Release_frees_key", s.testReleaseFrees},
		{"Release_twice_is_lease_lost", s.testReleaseTwice},
		{"Extend_keeps_lease_past_its_deadline", s.testExtendKeepsLease},
		{"Extend_by_non_holder_is_lease_lost", s.testExtendNonHolder},
		{"Extend_leaves_last_seen_so_held_leases_list_by_age", s.testExtendKeepsLastSeen},
		{"Retention_processed_key_expires", s.testRetentionExpiry},
		{"Retention_reported", s.testRetentionReported},
		{"Get_unknown_key_is_not_found", s.testGetUnknown},
		{"Get_fields_through_lifecycle", s.testGetLifecycle},
		{"Payload_hash_first_kept_mismatch_reported", s.testPayloadHash},
		{"Store_IsProcessed_and_MarkProcessed", s.testPlainStore},
		{"Store_MarkProcessed_over_live_lease", s.testMarkOverLease},
		{"Keys_special_characters_round_trip", s.testSpecialKeys},
		{"Keys_compared_byte_for_byte", s.testKeysByteForByte},
		{"Keys_max_length", s.testKeyMaxLength},
		{"Bad_input_rejected_without_change", s.testBadInput},
		{"Canceled_context_fails_without_change", s.testCanceledContext},
		{"TryBegin_returns_attempts", s.testAttemptsReturned},
		{"TryBegin_Retry_hint_changes_no_answer", s.testRetryHint},
		{"Fail_with_backoff_is_busy_until_it_ends", s.testFailBackoff},
		{"Fail_with_backoff_concurrent_claims_all_back_off", s.testFailBackoffConcurrent},
		{"Fail_without_backoff_frees_key_and_fences", s.testFailNoBackoff},
		{"Fail_dead_answers_dead_until_forgotten", s.testFailDead},
		{"Fail_dead_key_expires_with_retention", s.testDeadRetention},
		{"Admin_List_filters_by_prefix_state_and_age", s.testListFilters},
		{"Admin_List_pages_with_cursor", s.testListPages},
		{"Admin_List_in_key_order_across_pages", s.testListKeyOrder},
		{"Admin_Forget_makes_key_new", s.testForget},
		{"Admin_ForceRelease_frees_lease_and_backoff", s.testForceRelease},
		{"Go_calls_get_their_methods_answers", s.testGo},
		{"Order_key_without_a_gate_claims_as_usual", s.testOrderNoGate},
		{"Order_later_keys_wait_behind_a_failed_key_in_arrival_order", s.testOrderBehindInArrivalOrder},
		{"Order_processed_head_lets_the_next_waiting_key_run", s.testOrderProcessedHeadLetsNextRun},
		{"Order_processed_key_answers_processed_and_is_passed_over", s.testOrderProcessedKeyAnswersProcessed},
		{"Order_dead_head_holds_the_others_until_ReleaseOrder", s.testOrderDeadHeadUntilReleased},
		{"Order_bad_order_key_rejected_without_change", s.testOrderBadOrderKey},
		{"Order_concurrent_claims_behind_one_head_each_wait_once", s.testOrderConcurrentBehind},
		{"Order_not_kept_refuses_order_keys_without_change", s.testOrderNotKept},
	}
}

// ---- helpers ----

func (s *suite) store(t *testing.T) inbox.LeaseStore {
	t.Helper()
	return s.h.New(t, Config{})
}

// newKey returns a key no other subtest or run uses.
func newKey(t *testing.T, suffix string) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "storetest:" + hex.EncodeToString(b[:]) + ":" + suffix
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustBegin(t *testing.T, st inbox.LeaseStore, key string, opts inbox.BeginOptions, want inbox.Status) inbox.Claim {
	t.Helper()
	c, err := st.TryBegin(ctxT(t), key, opts)
	if err != nil {
		t.Fatalf("TryBegin(%q): %v", key, err)
	}
	if c.Status != want {
		t.Fatalf("TryBegin(%q) = %v, want %v (claim %+v)", key, c.Status, want, c)
	}
	return c
}

func mustGet(t *testing.T, st inbox.LeaseStore, key string) inbox.Record {
	t.Helper()
	r, err := st.Get(ctxT(t), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return r
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: error %v, want one wrapping %v", what, err, target)
	}
}

// within reports whether a and b differ by at most tol.
func within(a, b time.Time, tol time.Duration) bool {
	d := a.Sub(b)
	return d <= tol && d >= -tol
}

// pollUntil calls f until it returns true or the deadline passes.
func pollUntil(t *testing.T, deadline time.Duration, what string, f func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	wait := 10 * time.Millisecond
	for {
		if f() {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: still not true after %s", what, deadline)
		}
		time.Sleep(wait) // polling interval, not synchronisation: the condition decides.
		if wait < 100*time.Millisecond {
			wait *= 2
		}
	}
}

// sameRecord compares two records, times within the store's precision.
func (s *suite) sameRecord(a, b inbox.Record) bool {
	p := s.h.TimePrecision
	return a.State == b.State && a.Attempts == b.Attempts && a.Owner == b.Owner && a.PayloadHash == b.PayloadHash &&
		within(a.FirstSeen, b.FirstSeen, p) && within(a.LastSeen, b.LastSeen, p) && within(a.LeaseUntil, b.LeaseUntil, p) &&
		within(a.RetryAt, b.RetryAt, p) && a.Reason == b.Reason
}

// expireDeadline bounds how long the suite waits for a lease or retention of
// length d to run out: generous, so a loaded CI machine does not flake.
func expireDeadline(d time.Duration) time.Duration { return 10*d + 5*time.Second }

// expiryTolerance is how much earlier than its retention a key may read as
// expired: the store's time precision and some clock rounding.
func (s *suite) expiryTolerance() time.Duration { return 100*time.Millisecond + s.h.TimePrecision }
