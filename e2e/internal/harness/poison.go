package harness

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
)

// Poison is scenario (g): one consumer with MaxAttempts 3 (the default
// Backoff) and a poison queue outside the inbox, filtered with
// !inboxmw.IsTransient. A message whose handler always fails is published,
// then ordinary messages (on Kafka behind it, on its one partition). The
// failing message runs 3 times, is nacked twice (the backoff makes each
// redelivery wait in the consumer: no nack loop), and its third failure
// marks its key dead and sends it to the poison queue, with a reason that
// names the key; the ordinary messages are each applied once. inboxctl ls
// -state dead lists the key with the handler's error; a later copy of the
// message goes to the poison queue without running the handler. After
// inboxctl forget, a republished copy runs the (fixed) handler again and is
// applied once.
func Poison(t *testing.T, bk BrokerKind, sk StoreKind) {
	if sk.Tx {
		skip(t, sk.Name, "poison messages", noAttempts)
	}
	const n, maxAttempts = 10, 3
	e := newEnv(t, bk, sk, false, 1)
	spec := e.spec
	spec.MaxAttempts = maxAttempts
	spec.Poison = e.b.CreateDest(t, 1)
	const bad = "g-poison"
	spec.FailIDs = []string{bad}
	spec.Runs = NewRunLog()
	poisoned := e.b.Collect(t, spec.Poison)
	c := StartConsumer(t, spec, e.store.Shared)
	key := spec.Key(bad)
	ids := IDs("g", n)
	diag := func() string {
		var reasons []string
		for _, m := range poisoned.Messages() {
			reasons = append(reasons, fmt.Sprintf("%q", m.Metadata.Get(wmw.ReasonForPoisonedKey)))
		}
		return fmt.Sprintf("%d handler runs of %s, %d nacked, %d in the poison queue (reasons %s), missing %v; %s",
			len(c.Runs(bad)), bad, c.Probe.FailedFor(bad), len(reasons), strings.Join(reasons, ", "), e.missing(t, ids), describe(c))
	}

	start := time.Now()
	e.publish(t, NewMessage(bad, 0))
	for _, id := range ids {
		e.publish(t, NewMessage(id, 0))
	}
	waitFor(t, 60*time.Second, "the failing message in the poison queue",
		func() bool { return len(poisoned.Messages()) >= 1 }, diag)
	toPoison := time.Since(start)
	waitFor(t, 60*time.Second, "the ordinary messages applied",
		func() bool { return len(e.missing(t, ids)) == 0 }, diag)
	toAll := time.Since(start)

	// Exactly MaxAttempts runs, the first two nacked, none after.
	runs := c.Runs(bad)
	if len(runs) != maxAttempts || c.Probe.FailedFor(bad) != maxAttempts-1 {
		t.Fatalf("want %d handler runs of %s and %d nacks before the poison queue; %s", maxAttempts, bad, maxAttempts-1, diag())
	}
	// What the poison queue got: the message, and why.
	pm := poisoned.Messages()[0]
	checkPoisoned(t, pm, spec, key, ErrPoison.Error())
	// The store's record.
	if rec := e.record(t, bad); rec.State != inbox.StateDead || rec.Attempts != maxAttempts || rec.Reason != ErrPoison.Error() {
		t.Errorf("%s is %v with %d attempts and reason %q; want dead with %d and %q", key, rec.State, rec.Attempts, rec.Reason, maxAttempts, ErrPoison)
	}

	// What an operator sees: inboxctl ls -state dead lists exactly that key,
	// with the handler's error.
	prefix := strings.TrimSuffix(key, bad)
	text, recs := e.lsDead(t, prefix)
	if want := []CtlRecord{{Key: key, Status: "Dead", Attempts: maxAttempts, Reason: ErrPoison.Error()}}; !slices.Equal(recs, want) {
		t.Errorf("inboxctl -json ls -state dead -prefix %s: %+v; want %+v", prefix, recs, want)
	}
	if text != "" && (strings.Count(text, "\n") != 2 || !strings.Contains(text, key) || !strings.Contains(text, ErrPoison.Error())) {
		t.Errorf("inboxctl ls -state dead: want a header and one line with %s and its reason %q; got:\n%s", key, ErrPoison, text)
	}

	// A later copy of the dead message goes to the poison queue at once,
	// without running the handler.
	e.publish(t, NewMessage(bad, 0))
	waitFor(t, 60*time.Second, "the copy of the dead message in the poison queue",
		func() bool { return len(poisoned.Messages()) >= 2 }, diag)
	checkPoisoned(t, poisoned.Messages()[1], spec, key, ErrPoison.Error())
	if len(c.Runs(bad)) != maxAttempts || c.Probe.FailedFor(bad) != maxAttempts-1 {
		t.Errorf("the copy of a dead message ran or was nacked; %s", diag())
	}

	// The replay: the handler is fixed, the operator forgets the key and
	// republishes the message from the poison queue.
	spec.Runs.Heal(bad)
	forgot := e.forget(t, key)
	if rec := e.record(t, bad); rec.State != inbox.StateNotFound {
		t.Fatalf("after inboxctl forget (%q), %s is %v; want not found", strings.TrimSpace(forgot), key, rec.State)
	}
	replayed := time.Now()
	e.publish(t, pm.Copy())
	waitFor(t, 60*time.Second, "the replayed message applied and marked processed",
		func() bool { return len(e.missing(t, []string{bad})) == 0 && e.processed(t, []string{bad}) }, diag)
	toReplay := time.Since(replayed)
	stopAll(t, c)

	want := once(ids)
	want[bad] = 1
	e.expectCounts(t, want)
	e.expectProcessed(t, append(ids, bad))
	if n := len(c.Runs(bad)); n != maxAttempts+1 {
		t.Errorf("%s ran %d times, want %d (%d failing, then the replay)", bad, n, maxAttempts+1, maxAttempts)
	}
	if rec := e.record(t, bad); rec.Attempts != 1 {
		t.Errorf("the replayed %s has %d attempts, want 1 (forget starts it over)", key, rec.Attempts)
	}
	if got := c.Inbox.Outcomes.Get(inboxmw.OutcomeDead); got != 2 {
		t.Errorf("%d dead outcomes, want 2 (the last attempt, and the later copy)", got)
	}
	t.Logf("poisoned after %s (runs at +%s), %d ordinary messages applied after %s, replay applied in %s; %s",
		toPoison.Round(time.Millisecond), offsets(runs), n, toAll.Round(time.Millisecond), toReplay.Round(time.Millisecond), describe(c))
}

// checkPoisoned checks a message of the poison queue: the failing message,
// with a reason naming its dead key and the handler's error.
func checkPoisoned(t *testing.T, m *message.Message, spec ConsumerSpec, key, reason string) {
	t.Helper()
	if id := string(m.Payload); id != "g-poison" || m.Metadata.Get(keying.DefaultIDMetadataKey) != id {
		t.Errorf("the poison queue got payload %q with IdempotencyKey %q; want g-poison", m.Payload, m.Metadata.Get(keying.DefaultIDMetadataKey))
	}
	got := m.Metadata.Get(wmw.ReasonForPoisonedKey)
	if !strings.Contains(got, fmt.Sprintf("%q", key)) || !strings.Contains(got, "dead") || !strings.Contains(got, reason) {
		t.Errorf("poisoned with reason %q; want the dead key %q and %q", got, key, reason)
	}
	if topic := m.Metadata.Get(wmw.PoisonedTopicKey); topic != spec.Dest {
		t.Errorf("poisoned from topic %q, want %q", topic, spec.Dest)
	}
}

// offsets shows times relative to the first.
func offsets(ts []time.Time) string {
	var parts []string
	for _, ts0 := range ts {
		parts = append(parts, ts0.Sub(ts[0]).Round(time.Millisecond).String())
	}
	return strings.Join(parts, ", ")
}
