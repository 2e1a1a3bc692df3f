package harness

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
)

// Duplicates is scenario (a): every message is published three times (a
// producer retrying, with a new Watermill UUID each time, the same
// IdempotencyKey); one consumer applies each effect once.
func Duplicates(t *testing.T, bk BrokerKind, sk StoreKind) {
	const n, copies, partitions = 50, 3, 4
	e := newEnv(t, bk, sk, false, partitions)
	c := StartConsumer(t, e.spec, e.store.Shared)
	ids := IDs("a", n)
	for round := range copies {
		for i, id := range ids {
			e.publish(t, e.msg(id, i+round))
		}
	}
	waitFor(t, 90*time.Second, fmt.Sprintf("%d deliveries acked, %d messages applied", n*copies, n),
		func() bool { return c.Probe.Acked() >= n*copies && len(e.missing(t, ids)) == 0 },
		func() string { return fmt.Sprintf("missing %v; %s", e.missing(t, ids), describe(c)) })
	stopAll(t, c)
	e.expectCounts(t, once(ids))
	e.expectProcessed(t, ids)
	t.Logf("%s", describe(c))
}

// Competing is scenario (b): four consumers in one group compete for
// messages published twice each (on RabbitMQ one after the other, on Kafka
// on two partitions, so both copies are in flight at once on different
// consumers), and 10% of handler calls fail before the effect (the broker
// redelivers them). Each effect is applied exactly once, none is lost.
func Competing(t *testing.T, bk BrokerKind, sk StoreKind) {
	if sk.NoConcurrency != "" {
		skip(t, sk.Name, "competing consumers", sk.NoConcurrency)
	}
	const n, consumers, partitions = 100, 4, 4
	e := newEnv(t, bk, sk, false, partitions)
	spec := e.spec
	spec.FailRate = 0.1
	spec.Work = 10 * time.Millisecond
	var cs []*Consumer
	for range consumers {
		cs = append(cs, StartConsumer(t, spec, e.store.Shared))
	}
	e.b.WaitConsumers(t, spec.Dest, spec.Group, consumers)

	ids := IDs("b", n)
	for i, id := range ids {
		e.publish(t, e.msg(id, i), e.msg(id, i+1))
	}
	acked := func() (sum int64) {
		for _, c := range cs {
			sum += c.Probe.Acked()
		}
		return sum
	}
	waitFor(t, 120*time.Second, fmt.Sprintf("%d deliveries acked, %d messages applied", 2*n, n),
		func() bool { return acked() >= 2*n && len(e.missing(t, ids)) == 0 },
		func() string { return fmt.Sprintf("missing %v; %s", e.missing(t, ids), describe(cs...)) })
	stopAll(t, cs...)
	e.expectCounts(t, once(ids))
	e.expectProcessed(t, ids)

	var injected int64
	active := 0
	for _, c := range cs {
		injected += c.Probe.Injected()
		if c.Probe.Acked() > 0 {
			active++
		}
	}
	if injected == 0 {
		t.Errorf("no handler failure was injected: %s", describe(cs...))
	}
	if active < 2 {
		t.Errorf("only %d consumer(s) got messages, the others did not compete: %s", active, describe(cs...))
	}
	t.Logf("%d failures injected, %d consumers active; %s", injected, active, describe(cs...))
}

// Crash is scenario (c): a consumer process is killed with SIGKILL inside the
// handler of one message, before or after its effect. Another consumer then
// processes that message once its lease has expired. Killed before the
// effect: applied once. Killed after the effect but before the mark: the
// plain stores apply it again (the documented window: at most twice), the
// SQL transactional mode rolled the effect back with the claim, so once.
func Crash(at string) func(t *testing.T, bk BrokerKind, sk StoreKind) {
	return func(t *testing.T, bk BrokerKind, sk StoreKind) {
		if sk.NoCrossProcess != "" {
			skip(t, sk.Name, "crash", sk.NoCrossProcess)
		}
		const n = 8
		e := newEnv(t, bk, sk, false, 1) // one partition: messages in order, one at a time
		ids := IDs("c", n)
		crashID := ids[2]
		for _, id := range ids {
			e.publish(t, NewMessage(id, 0))
		}
		spec := e.spec
		spec.Lease = 1500 * time.Millisecond
		spec.CrashID, spec.CrashAt = crashID, at

		StartChild(t, spec).WaitKilled(t, 90*time.Second)
		if !sk.Tx {
			// The dead consumer's claim is still there (or its lease just
			// ran out on a slow machine): never processed.
			if rec := e.record(t, crashID); rec.State == inbox.StateProcessed || rec.State == inbox.StateNotFound || rec.Attempts != 1 {
				t.Fatalf("after the crash, %s is %v with %d attempts; want in progress (or its lease expired) with 1", crashID, rec.State, rec.Attempts)
			}
		} else if rec := e.record(t, crashID); rec.State != inbox.StateNotFound {
			t.Fatalf("after the crash, %s is %v; want not found (the claim rolled back with the effect)", crashID, rec.State)
		}

		spec.CrashID, spec.CrashAt = "", ""
		survivor := StartConsumer(t, spec, nil)
		waitFor(t, 90*time.Second, "every message applied and "+crashID+" marked processed",
			func() bool {
				return len(e.missing(t, ids)) == 0 && e.record(t, crashID).State == inbox.StateProcessed
			},
			func() string { return fmt.Sprintf("missing %v; %s", e.missing(t, ids), describe(survivor)) })
		stopAll(t, survivor)

		want := once(ids)
		got := e.ledger.Counts(t)[crashID]
		switch {
		case at == CrashBeforeEffect, sk.Tx:
		case got >= 1 && got <= 2:
			want[crashID] = got // the documented window: at most twice
		}
		e.expectCounts(t, want)
		e.expectProcessed(t, ids)
		if !sk.Tx {
			// The survivor took the key over after the dead consumer's lease
			// expired: a second attempt.
			if rec := e.record(t, crashID); rec.Attempts != 2 {
				t.Errorf("%s has %d attempts, want 2 (the dead consumer's and the survivor's)", crashID, rec.Attempts)
			}
		}
		t.Logf("killed %s the effect of %s: applied %d time(s); survivor: %s", strings.TrimSuffix(at, "-effect"), crashID, got, describe(survivor))
	}
}

// OutageLength is how long the outage scenario keeps the store unreachable.
const OutageLength = 10 * time.Second

// Outage is scenario (d): the link between the consumer and the store is
// cut for OutageLength mid-run (a fault proxy refuses connections; the
// shared services keep running). Deliveries during the outage fail with
// ErrStoreUnavailable without running the handler and are nacked, after
// the middleware backed off in-process; the store calls and the log lines
// they cost stay at a few a second; after the link is restored every message
// is applied once, none lost.
func Outage(t *testing.T, bk BrokerKind, sk StoreKind) {
	if sk.NoOutage != "" {
		skip(t, sk.Name, "store outage", sk.NoOutage)
	}
	const partitions = 4
	e := newEnv(t, bk, sk, true, partitions)
	spec := e.spec
	spec.Lease = 2 * time.Second
	spec.StoreTimeout = time.Second
	spec.MaxBusyWait = 3 * time.Second
	c := StartConsumer(t, spec, e.store.Shared)

	before, during := IDs("d-before", 10), IDs("d-during", 20)
	for i, id := range before {
		e.publish(t, e.msg(id, i))
	}
	waitFor(t, 60*time.Second, "the first messages applied",
		func() bool { return len(e.missing(t, before)) == 0 },
		func() string { return fmt.Sprintf("missing %v; %s", e.missing(t, before), describe(c)) })
	// And marked, so that the outage's calls are the claims it holds back,
	// not the retries of marks it happened to cut.
	waitFor(t, 60*time.Second, "the first messages marked processed",
		func() bool { return e.processed(t, before) },
		func() string { return describe(c) })

	out := c.Inbox.Outcomes
	e.store.Proxy.Cut()
	cut := time.Now()
	calls0 := out.Calls()
	lines0, errors0 := out.Lines()
	failedAtCut := c.Probe.StoreFailed()
	for i, id := range during {
		e.publish(t, e.msg(id, i))
	}
	applied := func() int { return len(during) - len(e.missing(t, during)) }
	waitFor(t, 60*time.Second, "deliveries failing on the store during the outage",
		func() bool { return c.Probe.StoreFailed() >= failedAtCut+2 || applied() > 0 },
		func() string { return describe(c) })
	if n := applied(); n != 0 {
		t.Fatalf("%d messages applied while the store was unreachable; %s", n, describe(c))
	}
	// The outage lasts OutageLength: its cost is measured over that time.
	time.Sleep(time.Until(cut.Add(OutageLength)))
	secs := time.Since(cut).Seconds()
	calls := float64(out.Calls()-calls0) / secs
	lines1, errors1 := out.Lines()
	lines := float64(lines1-lines0) / secs
	e.store.Proxy.Restore()

	waitFor(t, 90*time.Second, "every message applied after the outage",
		func() bool { return len(e.missing(t, during)) == 0 },
		func() string { return fmt.Sprintf("missing %v; %s", e.missing(t, during), describe(c)) })
	stopAll(t, c)
	e.expectCounts(t, once(before, during))
	// With a lease store, a delivery nacked for a store failure never ran the
	// handler: the claim failed, and a failed mark after a successful
	// handler is retried, never nacked. In the transactional mode the
	// handler runs inside the transaction, whose commit can fail in the
	// cut (even after the database committed it: the redelivery then sees a
	// duplicate); the ledger above is the check there.
	if v := c.Probe.Violations(); v != 0 && !sk.Tx {
		t.Errorf("%d deliveries ran the handler although the store failed", v)
	}
	// What the outage cost, for the one consumer: a few store calls and at
	// most a log line a second, not a call and a line per redelivery.
	if calls > MaxCallsPerSecond || lines > MaxLinesPerSecond {
		t.Errorf("the %.1f s outage cost %.1f store calls and %.1f log lines a second; want at most %v and %v",
			secs, calls, lines, MaxCallsPerSecond, MaxLinesPerSecond)
	}
	t.Logf("outage of %.1f s: %.2f store calls/s, %.2f log lines/s (%d at error level); %d deliveries nacked on store errors; %s",
		secs, calls, lines, errors1-errors0, c.Probe.StoreFailed()-failedAtCut, describe(c))
}

// MisconfiguredLength is how long the misconfigured-store scenario runs.
const MisconfiguredLength = 10 * time.Second

// Misconfigured is scenario (f): a store URL wrong in a way only a call
// finds (a missing table, a wrong password, a missing token), opened with
// check=false as a program that starts before its store does. With messages
// waiting, the consumer runs for MisconfiguredLength: what it costs the
// store and the logs stays within MaxCallsPerSecond and MaxLinesPerSecond,
// nothing is applied, and the messages are still there for a fixed
// deployment (the broker redelivers them).
func Misconfigured(t *testing.T, bk BrokerKind, sk StoreKind) {
	e := newEnv(t, bk, sk, false, 1)
	c := StartConsumer(t, e.spec, nil)
	ids := IDs("m", 3)
	for i, id := range ids {
		e.publish(t, e.msg(id, i))
	}
	start := time.Now()
	out := c.Inbox.Outcomes
	// The consumer runs for MisconfiguredLength: its cost is measured over
	// that time.
	time.Sleep(MisconfiguredLength)
	secs := time.Since(start).Seconds()
	calls := float64(out.Calls()) / secs
	all, errs := out.Lines()
	lines := float64(all) / secs
	if n := len(ids) - len(e.missing(t, ids)); n != 0 {
		t.Errorf("%d messages applied with a misconfigured store", n)
	}
	if out.Calls() == 0 || errs == 0 {
		t.Errorf("%d store calls and %d error lines: the misconfiguration was never met", out.Calls(), errs)
	}
	if calls > MaxCallsPerSecond || lines > MaxLinesPerSecond {
		t.Errorf("%.1f s with a misconfigured store cost %.1f store calls and %.1f log lines a second; want at most %v and %v",
			secs, calls, lines, MaxCallsPerSecond, MaxLinesPerSecond)
	}
	t.Logf("%.1f s with a misconfigured store: %.2f store calls/s, %.2f log lines/s (%d at error level); %s",
		secs, calls, lines, errs, describe(c))
}

// The bounds of what a failing store may cost one consumer (issue: a
// misconfigured or failing store must never become a hot loop).
const (
	MaxCallsPerSecond = 5
	MaxLinesPerSecond = 1
)

// BadInput is scenario (e): messages without any id, with an over-long id,
// with non-string and binary headers. By default (MissingKeyProcess) a
// message without id is processed without deduplication and counted
// (no_key); with MissingKeyReject it fails with ErrNoKey and a poison queue
// (filtered with !inboxmw.IsTransient) takes it. Nothing is lost and the
// router keeps processing the messages that follow.
func BadInput(t *testing.T, bk BrokerKind, sk StoreKind) {
	const partitions = 2
	e := newEnv(t, bk, sk, false, partitions)

	// MissingKeyProcess, the default.
	c := StartConsumer(t, e.spec, e.store.Shared)
	longID := "long-" + strings.Repeat("L", 2000)
	long := func(p int) *message.Message {
		m := e.msg("e-long", p)
		m.Metadata.Set(keying.DefaultIDMetadataKey, longID)
		return m
	}
	e.publish(t, long(0), long(1), long(0))
	want := map[string]int{"e-long": 1, "e-noid": 1, "e-after": 1}
	switch e.b.Kind {
	case Rabbit:
		e.b.PublishRaw(t, e.spec.Dest, Raw{Body: []byte("e-noid")})
		typed := Raw{Body: []byte("e-typed"), AMQPHeaders: amqp.Table{
			keying.DefaultIDMetadataKey: "typed-1",
			"int":                       int32(-7),
			"long":                      int64(1) << 40,
			"bool":                      true,
			"float":                     1.5,
			"time":                      time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC),
			"table":                     amqp.Table{"a": int32(1), "b": []byte{0xff}},
			"array":                     []any{int32(1), "x", false},
			"binary":                    []byte{0xff, 0x00, 0xfe, 0x80},
			"void":                      nil,
		}}
		byMessageID := Raw{Body: []byte("e-msgid"), MessageID: "message-id-1"}
		e.b.PublishRaw(t, e.spec.Dest, typed, typed, byMessageID, byMessageID)
		want["e-typed"], want["e-msgid"] = 1, 1
	case Kafka:
		binary := func(p int32) Raw {
			return Raw{Body: []byte("e-binary"), Partition: p % int32(e.partitions), KafkaHeaders: map[string][]byte{
				keying.DefaultIDMetadataKey: {0xff, 0xfe, 0x00, 'k'}, // not UTF-8: hashed into the key
				"blob":                      {0x00, 0xff, 0x80},
			}}
		}
		e.b.PublishRaw(t, e.spec.Dest, Raw{Body: []byte("e-noid")}, binary(0), binary(1))
		want["e-binary"] = 1
	}
	e.publish(t, NewMessage("e-after", 0))
	ids := make([]string, 0, len(want))
	for id := range want {
		ids = append(ids, id)
	}

	// MissingKeyReject with a poison queue, on a second destination.
	rspec := e.spec
	// A group of its own: joining the first consumer's Kafka group would
	// rebalance it, and a rebalance may redeliver e-noid, which has no key
	// to deduplicate it by.
	rspec.Group = e.spec.Group + "-reject"
	rspec.Dest = e.b.CreateDest(t, 1)
	rspec.Poison = e.b.CreateDest(t, 1)
	rspec.RejectMissing = true
	rc := StartConsumer(t, rspec, e.store.Shared)
	e.b.PublishRaw(t, rspec.Dest, Raw{Body: []byte("e-noid-rejected")})
	after := NewMessage("e-after-rejected", 0)
	if err := e.pub.Publish(rspec.Dest, after); err != nil {
		t.Fatal(err)
	}
	want["e-after-rejected"] = 1
	ids = append(ids, "e-after-rejected")

	waitFor(t, 90*time.Second, "every message applied", func() bool { return len(e.missing(t, ids)) == 0 },
		func() string { return fmt.Sprintf("missing %v; %s", e.missing(t, ids), describe(c, rc)) })
	poisoned := e.b.ReadOne(t, rspec.Poison, 60*time.Second)
	stopAll(t, c, rc)

	e.expectCounts(t, want)
	if got := string(poisoned.Payload); got != "e-noid-rejected" {
		t.Errorf("the poison queue got %q, want e-noid-rejected", got)
	}
	if reason := poisoned.Metadata.Get("reason_poisoned"); !strings.Contains(reason, "no id") {
		t.Errorf("poisoned with reason %q; want ErrNoKey's", reason)
	}
	if o := c.Inbox.Outcomes; o != nil && o.Get(inboxmw.OutcomeNoKey) < 1 {
		t.Errorf("no no_key outcome counted: %s", o)
	}
	if o := rc.Inbox.Outcomes; o != nil && o.Get(inboxmw.OutcomeNoKey) < 1 {
		t.Errorf("no no_key outcome counted with MissingKeyReject: %s", o)
	}
	// The over-long id was hashed into the key, and deduplicated.
	e.expectProcessed(t, []string{longID})
	t.Logf("process: %s reject: %s", describe(c), describe(rc))
}
