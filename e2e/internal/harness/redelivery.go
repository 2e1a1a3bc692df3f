package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/middleware"
)

// Crash points of a consumer's hand-off of a failed attempt to the broker
// (ConsumerSpec.Redeliver): before the copy is published, or once the
// broker holds it but before the original is acked.
const (
	CrashBeforeCopy = "before-copy"
	CrashAfterCopy  = "after-copy"
)

// HandoffLog records the hand-offs of failed attempts to the broker.
type HandoffLog struct {
	mu sync.Mutex
	h  map[string][]Handoff
}

// Handoff is one copy handed to the broker: when, and the delay asked.
type Handoff struct {
	At    time.Time
	Delay time.Duration
}

func (l *HandoffLog) add(id string, h Handoff) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h == nil {
		l.h = map[string][]Handoff{}
	}
	l.h[id] = append(l.h[id], h)
}

// Of returns the hand-offs of the message (payload) id, in order.
func (l *HandoffLog) Of(id string) []Handoff {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.h[id])
}

// Total is the number of hand-offs.
func (l *HandoffLog) Total() (n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, h := range l.h {
		n += len(h)
	}
	return n
}

// redelivery is a consumer's inboxmw.Redeliverer: the broker's (RabbitMQ
// delay queues, Kafka retry topics), logging each hand-off and killing the
// process at the spec's crash point.
type redelivery struct {
	spec       ConsumerSpec
	inner      inboxmw.Redeliverer
	subscriber func(message.Subscriber) message.Subscriber
	close      func() error
}

func newRedelivery(ctx context.Context, spec ConsumerSpec) (*redelivery, error) {
	r := &redelivery{spec: spec, subscriber: func(s message.Subscriber) message.Subscriber { return s }}
	switch b := spec.Broker; b.Kind {
	case Rabbit:
		d, err := inboxamqp.NewDelays(ctx, inboxamqp.DelaysConfig{URI: b.AMQPURL, Queues: []string{spec.Dest}})
		if err != nil {
			return nil, err
		}
		r.inner, r.close = d, d.Close
	case Kafka:
		k, err := inboxkafka.NewRetry(ctx, inboxkafka.RetryConfig{
			Brokers: b.Brokers, ConsumerGroup: spec.Group, Topics: []string{spec.Dest}, SaramaConfig: b.subscriberConfig(),
		})
		if err != nil {
			return nil, err
		}
		r.inner, r.close, r.subscriber = k, k.Close, k.Subscriber
	default:
		return nil, fmt.Errorf("unknown broker kind %q", b.Kind)
	}
	return r, nil
}

// Redeliver implements inboxmw.Redeliverer.
func (r *redelivery) Redeliver(ctx context.Context, topic string, msg *message.Message, delay time.Duration) error {
	id := string(msg.Payload)
	crash := id == r.spec.CrashID
	if crash && r.spec.CrashAt == CrashBeforeCopy {
		kill()
	}
	at := time.Now()
	err := r.inner.Redeliver(ctx, topic, msg, delay)
	if err != nil {
		return err
	}
	r.spec.Handoffs.add(id, Handoff{At: at, Delay: delay})
	if crash && r.spec.CrashAt == CrashAfterCopy {
		kill() // the broker holds the copy; the original is not acked
	}
	return nil
}

func kill() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// cleanupRedelivery deletes what the redelivery of dest and group leaves on
// the broker when the test ends: RabbitMQ's delay queues (a kfake cluster
// goes as a whole; a real Kafka's retry topics are deleted).
func (e *env) cleanupRedelivery(t *testing.T, dest, group string) {
	switch e.b.Kind {
	case Rabbit:
		t.Cleanup(func() {
			conn, ch := e.b.amqpChannel(t)
			defer conn.Close()
			for _, d := range inboxamqp.DefaultDelays {
				if _, err := ch.QueueDelete(inboxamqp.DelayQueueName(dest, d), false, false, false); err != nil {
					t.Errorf("deleting the delay queues of %s: %v", dest, err)
					return
				}
			}
		})
	case Kafka:
		t.Cleanup(func() {
			admin, err := sarama.NewClusterAdmin(e.b.Brokers, e.b.saramaConfig())
			if err != nil {
				t.Errorf("kafka admin: %v", err)
				return
			}
			defer admin.Close()
			for _, d := range inboxkafka.DefaultDelays {
				name := inboxkafka.DefaultTopicName(dest, group, d)
				if err := admin.DeleteTopic(name); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
					t.Errorf("deleting retry topic %s: %v", name, err)
				}
			}
		})
	}
}

// RedeliveryCrash is scenario (i): a consumer process whose handler fails
// the first attempt of every message hands the failed attempt to the
// broker (RabbitMQ delay queues, Kafka retry topics) and is killed with
// SIGKILL at the hand-off of the first message: before the copy (the store
// holds the backoff, the broker holds only the original), or after the
// broker confirmed the copy and before the original's ack (the broker holds
// both). A survivor then handles everything: each effect is applied exactly
// once (the failure came before the effect, so no crash window applies), and
// after the copy, the second delivery is dropped as a duplicate by its key.
func RedeliveryCrash(at string) func(t *testing.T, bk BrokerKind, sk StoreKind) {
	return func(t *testing.T, bk BrokerKind, sk StoreKind) {
		if sk.NoCrossProcess != "" {
			skip(t, sk.Name, "redelivery crash", sk.NoCrossProcess)
		}
		const n = 6
		e := newEnv(t, bk, sk, false, 1) // one partition: messages in order, one at a time
		spec := e.spec
		spec.Redeliver, spec.FailFirst, spec.Backoff = true, 1, 700*time.Millisecond
		e.cleanupRedelivery(t, spec.Dest, spec.Group)
		ids := IDs("i", n)
		crashID := ids[0]
		for _, id := range ids {
			e.publish(t, NewMessage(id, 0))
		}
		spec.CrashID, spec.CrashAt = crashID, at
		StartChild(t, spec).WaitKilled(t, 90*time.Second)
		switch rec := e.record(t, crashID); {
		case sk.Tx && rec.State != inbox.StateNotFound:
			t.Fatalf("after the crash, %s is %v; want not found (rolled back)", crashID, rec.State)
		case !sk.Tx && (rec.State == inbox.StateProcessed || rec.Attempts != 1):
			t.Fatalf("after the crash, %s is %v with %d attempts; want its one failed attempt, not processed", crashID, rec.State, rec.Attempts)
		}

		spec.CrashID, spec.CrashAt = "", ""
		survivor := StartConsumer(t, spec, nil)
		waitFor(t, 90*time.Second, "every message applied and marked processed",
			func() bool { return len(e.missing(t, ids)) == 0 && e.processed(t, ids) },
			func() string { return fmt.Sprintf("missing %v; %s", e.missing(t, ids), describe(survivor)) })
		if at == CrashAfterCopy {
			// The broker held two deliveries of crashID: the one that did
			// not run (or a copy it was handed off as, still in a delay)
			// comes back and is dropped as a duplicate.
			waitFor(t, 30*time.Second, "the second delivery of "+crashID+" dropped as a duplicate",
				func() bool { return survivor.Inbox.Outcomes.Get(inboxmw.OutcomeDuplicate) >= 1 },
				func() string { return describe(survivor) })
		}
		stopAll(t, survivor)
		e.expectCounts(t, once(ids))
		e.expectProcessed(t, ids)
		dup := survivor.Inbox.Outcomes.Get(inboxmw.OutcomeDuplicate)
		t.Logf("killed %s the copy of %s: applied once; the survivor handed off %d failed attempts and dropped %d duplicates; %s",
			at[:len(at)-len("-copy")], crashID, survivor.Spec.Handoffs.Total(), dup, describe(survivor))
	}
}

// poisonBackoff is the backoff of RedeliveryThroughput's failing phase.
const poisonBackoff = 400 * time.Millisecond

// RedeliveryThroughput is scenario (j): the same messages handled twice,
// with hand-offs to the broker (ConsumerSpec.Redeliver): once with a
// handler that never fails, then with one whose every call fails at random
// with probability 0.1 (before the effect) plus poison messages, one per
// consumer, that always fail, with MaxAttempts 3 and a fixed Backoff.
// Every effect is applied exactly once, none lost; each poison message ran
// exactly 3 times, each run at least its hand-off's delay after the
// previous one, and is dead in the store and in the poison queue. It logs
// the ratio of the throughputs (keys applied per second until 90% of them
// were, which leaves out the tail of the last backoffs; the ratio until all
// were is logged too).
func RedeliveryThroughput(t *testing.T, bk BrokerKind, sk StoreKind) {
	const n, lanes = 400, 4
	var rates [2]struct{ at90, all float64 }
	for i, failing := range []bool{false, true} {
		e := newEnv(t, bk, sk, false, lanes)
		spec := e.spec
		spec.Redeliver, spec.Handoffs, spec.Runs = true, &HandoffLog{}, NewRunLog()
		e.cleanupRedelivery(t, spec.Dest, spec.Group)
		var poison []string
		if failing {
			// A fixed backoff, so that the spacing of a poison message's
			// runs can be checked against it whether its wait was handed
			// to the broker or (under RedeliveryMinDelay) waited in-process.
			spec.FailRate, spec.MaxAttempts, spec.Backoff = 0.1, 3, poisonBackoff
			spec.Poison = e.b.CreateDest(t, lanes) // its messages keep their lane's partition
			poison = IDs("j-poison", lanes)
			spec.FailIDs = poison
		}
		shared := e.sharedStore(t)
		consumers := 1
		if e.b.Kind == Rabbit {
			consumers = lanes
		}
		var cs []*Consumer
		for range consumers {
			cs = append(cs, StartConsumer(t, spec, shared))
		}
		e.b.WaitConsumers(t, spec.Dest, spec.Group, consumers)
		var poisoned *Collector
		if failing {
			poisoned = e.b.Collect(t, spec.Poison)
		}

		// Warm up (connections, pools, the first partitions' fetches)
		// before the clock starts. A message whose handler fails 3 times
		// (at random, about 1 in 1000; or because the harness makes the 4th
		// call of every consumer fail when none did yet, which a copy can
		// meet on three consumers in turn) is dead: in the poison queue,
		// not applied.
		warm := IDs("j-warm", 2*lanes)
		for j, id := range warm {
			e.publish(t, e.msg(id, j))
		}
		warmDied := e.waitAppliedOrDead(t, warm, 60*time.Second, nil, spec, cs)

		ids := IDs("j", n)
		start := time.Now()
		for j, id := range poison {
			e.publish(t, e.msg(id, j))
		}
		for j, id := range ids {
			e.publish(t, e.msg(id, j))
		}
		var at90 time.Duration
		died := e.waitAppliedOrDead(t, ids, 180*time.Second, func(missing int) {
			if at90 == 0 && missing <= n/10 {
				at90 = time.Since(start)
			}
		}, spec, cs)
		all := time.Since(start)
		died = append(died, warmDied...)
		if failing {
			waitFor(t, 120*time.Second, "every dead message in the poison queue",
				func() bool { return len(poisoned.Messages()) >= len(poison)+len(died) },
				func() string { return fmt.Sprintf("%d poisoned; %s", len(poisoned.Messages()), describe(cs...)) })
		}
		stopAll(t, cs...)
		applied := slices.DeleteFunc(append(slices.Clone(warm), ids...), func(id string) bool { return slices.Contains(died, id) })
		e.expectCounts(t, once(applied))
		e.expectProcessed(t, applied)
		if failing {
			in := map[string]int{}
			for _, m := range poisoned.Messages() {
				in[string(m.Payload)]++
			}
			for _, id := range append(slices.Clone(poison), died...) {
				if in[id] != 1 {
					t.Errorf("%s is %d times in the poison queue, want once", id, in[id])
				}
			}
			for _, id := range died {
				if runs := spec.Runs.Runs(id); len(runs) != 3 {
					t.Errorf("%s died after %d runs, want 3", id, len(runs))
				}
			}
		}
		for _, id := range poison {
			runs, hs := spec.Runs.Runs(id), spec.Handoffs.Of(id)
			if rec := e.record(t, id); len(runs) != 3 || rec.State != inbox.StateDead || rec.Attempts != 3 {
				t.Errorf("poison %s ran %d times and is %v after %d attempts; want 3 runs, dead after 3", id, len(runs), rec.State, rec.Attempts)
				continue
			}
			if len(hs) < 2 {
				t.Errorf("poison %s was handed off %d times, want at least 2 (its backoff is above RedeliveryMinDelay)", id, len(hs))
			}
			for k := 1; k < len(runs); k++ {
				if gap := runs[k].Sub(runs[k-1]); gap < poisonBackoff {
					t.Errorf("poison %s: run %d came %s after run %d, before the backoff of %s", id, k+1, gap, k, poisonBackoff)
				}
			}
		}
		var injected int64
		for _, c := range cs {
			injected += c.Probe.Injected()
		}
		if failing && injected == 0 {
			t.Errorf("no failure injected: %s", describe(cs...))
		}
		rates[i].at90 = float64(n-n/10) / at90.Seconds()
		rates[i].all = float64(n) / all.Seconds()
		t.Logf("failing=%v: %d messages (+%d poison) through %d consumer(s) in %s (90%% in %s); %d failures injected, %d hand-offs, %d dead of random failures %v; %s",
			failing, n, len(poison), consumers, all.Round(time.Millisecond), at90.Round(time.Millisecond), injected, spec.Handoffs.Total(), len(died), died, describe(cs...))
	}
	testenv.Report(t, "throughput with failures ÷ without: %.2f (keys applied per second until 90%% were; until all were: %.2f)",
		rates[1].at90/rates[0].at90, rates[1].all/rates[0].all)
}

// waitAppliedOrDead waits until every message of ids is applied, or dead
// after its handler failed on every attempt MaxAttempts allows, and returns
// the dead ones. progress, when not nil, is told how many are not applied
// at each poll.
func (e *env) waitAppliedOrDead(t *testing.T, ids []string, within time.Duration, progress func(missing int), spec ConsumerSpec, cs []*Consumer) (died []string) {
	t.Helper()
	waitFor(t, within, fmt.Sprintf("%d messages applied or dead", len(ids)),
		func() bool {
			missing := e.missing(t, ids)
			if progress != nil {
				progress(len(missing))
			}
			if len(missing) > max(len(ids)/50, 2) {
				return false
			}
			for _, id := range missing {
				if e.record(t, id).State != inbox.StateDead {
					return false
				}
			}
			died = missing
			return true
		},
		func() string {
			var b strings.Builder
			for _, id := range e.missing(t, ids) {
				fmt.Fprintf(&b, "%s: record %+v, runs %v, hand-offs %v; ", id, e.record(t, id), spec.Runs.Runs(id), spec.Handoffs.Of(id))
			}
			return fmt.Sprintf("missing %s%s", b.String(), describe(cs...))
		})
	return died
}
