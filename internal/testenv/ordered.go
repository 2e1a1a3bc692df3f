package testenv

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Ledger is the workload of the tests of order keys on a broker: Accounts
// accounts with Events events each, published one event of every account
// after the other, whose handler fails the first attempt of about one event
// in FailOneIn (the same events on every run) and records, per account, the
// order in which the others were applied.
type Ledger struct {
	Accounts, Events, FailOneIn int

	mu      sync.Mutex
	applied map[string][]int // account: the events applied, in order
	ran     map[string]int   // event id: handler runs
}

// Messages returns the events in publish order: event 0 of every account,
// then event 1, and so on. Each has the metadata IdempotencyKey, account
// (the order key) and seq (the event's number in its account).
func (l *Ledger) Messages() []*message.Message {
	var msgs []*message.Message
	for e := range l.Events {
		for a := range l.Accounts {
			m := message.NewMessage(watermill.NewUUID(), nil)
			m.Metadata.Set("IdempotencyKey", fmt.Sprintf("acct%d-ev%d", a, e))
			m.Metadata.Set("account", fmt.Sprintf("acct%d", a))
			m.Metadata.Set("seq", strconv.Itoa(e))
			msgs = append(msgs, m)
		}
	}
	return msgs
}

// Handle is the handler: it fails the first attempt of the chosen events
// and applies the others.
func (l *Ledger) Handle(m *message.Message) error {
	id, acct := m.Metadata.Get("IdempotencyKey"), m.Metadata.Get("account")
	n, err := strconv.Atoi(m.Metadata.Get("seq"))
	if err != nil {
		return fmt.Errorf("event %s without seq: %w", id, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ran == nil {
		l.ran, l.applied = map[string]int{}, map[string][]int{}
	}
	if l.ran[id]++; l.ran[id] == 1 && l.failsFirst(id) {
		return errors.New("ledger busy")
	}
	l.applied[acct] = append(l.applied[acct], n)
	return nil
}

func (l *Ledger) failsFirst(id string) bool {
	h := fnv.New32a()
	h.Write([]byte(id))
	return h.Sum32()%uint32(l.FailOneIn) == 0
}

// Done reports whether as many events were applied as were published.
func (l *Ledger) Done() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, seqs := range l.applied {
		n += len(seqs)
	}
	return n >= l.Accounts*l.Events
}

// Check fails t unless some first attempts failed and every account's
// events were applied once each, in their order.
func (l *Ledger) Check(t testing.TB) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	failed := 0
	for id := range l.ran {
		if l.failsFirst(id) {
			failed++
		}
	}
	if failed == 0 {
		t.Fatal("no first attempt failed: the test checks nothing")
	}
	want := make([]int, l.Events)
	for e := range want {
		want[e] = e
	}
	for a := range l.Accounts {
		acct := fmt.Sprintf("acct%d", a)
		if got := l.applied[acct]; !slices.Equal(got, want) {
			t.Errorf("%s's events applied in the order %v, want %v", acct, got, want)
		}
	}
	t.Logf("%d of %d events failed their first attempt", failed, l.Accounts*l.Events)
}
