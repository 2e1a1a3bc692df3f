package server

import (
	"fmt"
	"testing"
	"time"
)

// The failed authentications of any number of addresses take at most
// maxAuthAddrs entries; a blocked address is pushed out last, so a guesser
// stays blocked while others come and go.
func TestAuthFailures_memory_is_bounded(t *testing.T) {
	t.Parallel()
	a := newAuthFailures(2)
	now := time.Now()
	for range 3 {
		a.fail("198.51.100.7:1", now)
	}
	if _, blocked := a.blocked("198.51.100.7:2", now); !blocked {
		t.Fatal("the guesser is not blocked after 3 failures of a budget of 2")
	}
	for i := range 3 * maxAuthAddrs {
		a.fail(fmt.Sprintf("[2001:db8:%x::1]:1", i), now)
		if len(a.addrs) > maxAuthAddrs {
			t.Fatalf("%d addresses kept, over %d", len(a.addrs), maxAuthAddrs)
		}
	}
	if _, blocked := a.blocked("198.51.100.7:3", now); !blocked {
		t.Fatal("the guesser was pushed out by addresses that are not blocked")
	}
	if got, want := clientKey("[2001:db8::1]:80"), clientKey("[2001:db8::ffff]:81"); got != want {
		t.Errorf("two addresses of one IPv6 /64 count apart: %s, %s", got, want)
	}
	if clientKey("[::ffff:198.51.100.7]:1") != clientKey("198.51.100.7:1") {
		t.Error("an IPv4-mapped address counts apart from its IPv4 address")
	}
}

// What the records count stays bounded: by the store's capacity when no
// limit is in force (one tenant: the store evicts, and so does the
// count), and the operators' records are not counted without a capacity.
func TestRecords_memory_is_bounded(t *testing.T) {
	t.Parallel()
	r := newRecords(Config{StoreCapacity: 10, LeaseMax: time.Minute, Retention: time.Hour})
	r.setTenants(1)
	one := &tenant{}
	for i := range 100 {
		done, _, reason := r.admit(one, fmt.Sprintf("k%d", i))
		if reason != "" {
			t.Fatalf("key %d refused with one tenant: %s", i, reason)
		}
		done(true)
		if len(r.keys) > 10 {
			t.Fatalf("%d records counted, over the capacity of 10", len(r.keys))
		}
	}
	r = newRecords(Config{MaxRecordsPerToken: 5, LeaseMax: time.Minute, Retention: time.Hour})
	r.setTenants(1)
	admin := &tenant{admin: true}
	for i := range 100 {
		done, _, reason := r.admit(admin, fmt.Sprintf("k%d", i))
		if reason != "" {
			t.Fatalf("an operator's key refused: %s", reason)
		}
		done(true)
	}
	if len(r.keys) != 0 {
		t.Fatalf("%d operators' records counted without a store capacity", len(r.keys))
	}
}
