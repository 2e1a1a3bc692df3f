package inboxmw_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// tsKey is the metadata field testTimestamp reads: the broker timestamp of
// the tests' messages.
const tsKey = "test_timestamp"

func testTimestamp(msg *message.Message) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339Nano, msg.Metadata.Get(tsKey))
	return t, err == nil
}

// aged returns a message for id whose broker timestamp is age ago.
func aged(id string, age time.Duration) *message.Message {
	m := msgFor(id)
	m.Metadata.Set(tsKey, time.Now().Add(-age).Format(time.RFC3339Nano))
	return m
}

func newRetained(t *testing.T, retention time.Duration) *memory.Store {
	t.Helper()
	s, err := memory.New(memory.Options{Retention: retention})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestInbox_stale_message_warned_counted_and_handled(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	logs := watermill.NewCaptureLogger()
	store := newRetained(t, time.Hour)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), Metrics: rec, Logger: logs, Timestamp: testTimestamp})
	var runs atomic.Int32
	h := func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil }

	// The default margin is a tenth of the retention: stale beyond 54 min.
	for _, c := range []struct {
		id    string
		msg   *message.Message
		stale bool
	}{
		{"fresh", aged("fresh", time.Minute), false},
		{"within-margin", aged("within-margin", 50*time.Minute), false},
		{"in-margin", aged("in-margin", 58*time.Minute), true},
		{"old", aged("old", 3*time.Hour), true},
		{"no-timestamp", msgFor("no-timestamp"), false},
	} {
		before, ran := rec.get(inboxmw.OutcomeStale), runs.Load()
		if _, err := call(ib, h, c.msg); err != nil {
			t.Fatalf("%s: %v", c.id, err)
		}
		c.msg.Ack()
		if got := rec.get(inboxmw.OutcomeStale) - before; got != map[bool]int{true: 1}[c.stale] {
			t.Errorf("%s: stale counted %d times, stale %v", c.id, got, c.stale)
		}
		if runs.Load() != ran+1 {
			t.Errorf("%s: the handler did not run (StaleWarn handles every message)", c.id)
		}
	}
	var lines []watermill.CapturedMessage
	for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
		if m.Msg == "Message older than the store's retention: its key may have expired, so a replay cannot be told from new work; handling it" {
			lines = append(lines, m)
		}
	}
	// The second stale message falls within the first one's 10 s of quiet.
	if len(lines) != 1 || lines[0].Fields["inbox_key"] != testKeyPrefix+"in-margin" || lines[0].Fields["retention"] != "1h0m0s" ||
		lines[0].Fields["stale_margin"] != "6m0s" || !errors.Is(lines[0].Err, inbox.ErrStale) {
		t.Errorf("stale log lines: %+v; want one, for in-margin, with the retention, the margin and ErrStale", lines)
	}
	testenv.Eventually(t, 5*time.Second, "the stale message's key processed (StaleWarn handles it as usual)", func() bool {
		return stateOf(t, store, "old") == inbox.StateProcessed
	})
}

func stateOf(t *testing.T, store inbox.LeaseStore, id string) inbox.State {
	t.Helper()
	r, err := store.Get(context.Background(), testKeyPrefix+id)
	if err != nil {
		t.Fatal(err)
	}
	return r.State
}

func TestInbox_stale_message_refused_under_StaleReject(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	store := newRetained(t, time.Hour)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), Metrics: rec, Timestamp: testTimestamp,
		Stale: inboxmw.StaleReject, StaleMargin: time.Minute})
	var runs atomic.Int32
	h := func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil }

	_, err := call(ib, h, aged("old", 61*time.Minute))
	if !errors.Is(err, inbox.ErrStale) || inboxmw.IsTransient(err) {
		t.Fatalf("error %v (transient %v), want one wrapping ErrStale, not transient", err, inboxmw.IsTransient(err))
	}
	if runs.Load() != 0 || rec.get(inboxmw.OutcomeStale) != 1 {
		t.Fatalf("handler ran %d times, stale counted %d; want 0 and 1", runs.Load(), rec.get(inboxmw.OutcomeStale))
	}
	if st := stateOf(t, store, "old"); st != inbox.StateNotFound {
		t.Fatalf("the refused message's key is %v, want never claimed", st)
	}
	// With a margin of 1 min, 58 min is not stale.
	m := aged("recent", 58*time.Minute)
	if _, err := call(ib, h, m); err != nil || runs.Load() != 1 {
		t.Fatalf("a message within the retention less the margin: %v, %d runs", err, runs.Load())
	}
	m.Ack()
	if rec.get(inboxmw.OutcomeStale) != 1 {
		t.Fatalf("stale counted %d times, want 1", rec.get(inboxmw.OutcomeStale))
	}
}

// A store that does not report its retention gets no check: the middleware
// says so once, at New.
func TestInbox_stale_check_off_without_retention(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	logs := watermill.NewCaptureLogger()
	ib := newInbox(t, inboxmw.Config{Store: plainStore{newMemory(t)}, Alias: staticAlias(), Metrics: rec, Logger: logs,
		Timestamp: testTimestamp, Stale: inboxmw.StaleReject})
	if !logged(logs, watermill.InfoLogLevel, "Inbox store does not report its retention: no stale check (Config.Timestamp is ignored)") {
		t.Error("New did not say that the stale check is off")
	}
	m := aged("old", 30*24*time.Hour)
	if _, err := call(ib, ok, m); err != nil {
		t.Fatalf("an old message on a store without a retention: %v", err)
	}
	m.Ack()
	if rec.get(inboxmw.OutcomeStale) != 0 {
		t.Fatal("stale counted on a store without a retention")
	}
}

func TestConfig_stale_fields_validated(t *testing.T) {
	t.Parallel()
	for _, c := range []inboxmw.Config{
		{Stale: inboxmw.StalePolicy(7)},
		{StaleMargin: -time.Second},
	} {
		c.Store, c.Bus, c.Group = newMemory(t), "b", "g"
		_, err := inboxmw.New(c)
		if !errors.Is(err, inboxmw.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", c, err)
		}
	}
}

// StaleReject refuses a message older than the store's retention (less the
// margin) with an error wrapping inbox.ErrStale, which IsTransient reports
// permanent: a filtered poison queue outside the inbox takes it.
func ExampleStalePolicy() {
	store, _ := memory.New(memory.Options{Retention: time.Hour})
	ib, _ := inboxmw.New(inboxmw.Config{
		Store: store, Bus: "b", Group: "g", Alias: keying.StaticAlias("h"),
		Timestamp: testTimestamp, // inboxkafka.Timestamp, inboxamqp.Timestamp
		Stale:     inboxmw.StaleReject,
	})
	msg := message.NewMessage("m-1", nil)
	msg.Metadata.Set(tsKey, time.Now().Add(-2*time.Hour).Format(time.RFC3339Nano))
	_, err := ib.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
	fmt.Println(errors.Is(err, inbox.ErrStale), inboxmw.IsTransient(err))
	_ = ib.Close(context.Background())
	// Output: true false
}
