package harness

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores"
)

// noAttempts is why the poison and backoff scenarios skip the SQL
// transactional mode.
const noAttempts = "Config.Validate refuses MaxAttempts with a TxStore: its claim commits or rolls back " +
	"with the handler's transaction, so it counts no attempts and holds no backoff"

// Backoff is scenario (h): every message's handler fails twice, then
// succeeds, with the default Backoff (full jitter: the wait after the
// attempt-th failure is drawn from [0, 1 s × 2^attempt)). Each message runs
// 3 times and is nacked exactly twice (each redelivery waits in the consumer
// for the backoff the store holds, then runs: no nack loop); the gap before
// the second run is under 2 s and the gap before the third under 4 s (plus
// backoffSlack), and the gaps grow.
//
// Messages go through lanes in parallel (Kafka partitions of one consumer;
// RabbitMQ consumers of one queue, with a prefetch of one, sharing one
// store), each lane's messages one after the other.
func Backoff(t *testing.T, bk BrokerKind, sk StoreKind) {
	if sk.Tx {
		skip(t, sk.Name, "backoff", noAttempts)
	}
	// With full jitter one pair of gaps is random; their means over n
	// messages are compared. gap1 = B1 + o1 and gap2 = B2 + o2, B1 uniform
	// on [0, 2 s), B2 on [0, 4 s), o the overhead (the Fail, the redelivery,
	// the end of the busy poll: at most 250 ms after the backoff). The mean
	// of gap2-gap1 over n = 48 messages is 1 s with a standard deviation of
	// sqrt((16+4)/12/48) = 0.19 s: it is <= 0 (a false failure) with a
	// probability of about 4e-8 per cell. The means themselves are over half
	// their expectation (1 s and 2 s) at 6 standard deviations.
	const n, lanes, failures = 48, 16, 2
	const backoffSlack = 1500 * time.Millisecond
	e := newEnv(t, bk, sk, false, lanes)
	spec := e.spec
	spec.FailFirst = failures
	spec.Runs = NewRunLog() // shared by the consumers: a message fails twice in all
	shared := e.store.Shared
	consumers := 1
	if e.b.Kind == Rabbit {
		consumers = lanes
		shared = e.sharedStore(t)
	}
	var cs []*Consumer
	for range consumers {
		cs = append(cs, StartConsumer(t, spec, shared))
	}
	e.b.WaitConsumers(t, spec.Dest, spec.Group, consumers)

	ids := IDs("h", n)
	start := time.Now()
	for i, id := range ids {
		e.publish(t, e.msg(id, i))
	}
	acked := func() (sum int64) {
		for _, c := range cs {
			sum += c.Probe.Acked()
		}
		return sum
	}
	waitFor(t, 120*time.Second, fmt.Sprintf("%d messages applied and acked", n),
		func() bool { return acked() >= n && len(e.missing(t, ids)) == 0 },
		func() string { return fmt.Sprintf("missing %v; %s", e.missing(t, ids), describe(cs...)) })
	elapsed := time.Since(start)
	stopAll(t, cs...)
	e.expectCounts(t, once(ids))
	e.expectProcessed(t, ids)

	var gap1, gap2 []time.Duration
	for _, id := range ids {
		runs := spec.Runs.Runs(id)
		nacks := 0
		for _, c := range cs {
			nacks += c.Probe.FailedFor(id)
		}
		if len(runs) != failures+1 || nacks != failures {
			t.Errorf("%s ran %d times and was nacked %d times; want %d and %d", id, len(runs), nacks, failures+1, failures)
			continue
		}
		gap1 = append(gap1, runs[1].Sub(runs[0]))
		gap2 = append(gap2, runs[2].Sub(runs[1]))
	}
	if t.Failed() {
		return
	}
	for i, bound := range []time.Duration{2 * time.Second, 4 * time.Second} {
		gaps := [][]time.Duration{gap1, gap2}[i]
		if m := slices.Max(gaps); m >= bound+backoffSlack {
			t.Errorf("a gap before run %d was %s; want under %s (the backoff's bound) + %s", i+2, m, bound, backoffSlack)
		}
	}
	m1, m2 := mean(gap1), mean(gap2)
	if m2 <= m1 || m1 < 500*time.Millisecond || m2 < time.Second {
		t.Errorf("mean gaps %s then %s: want them growing (about 1 s then 2 s with the default Backoff)", m1, m2)
	}
	busy := 0
	for _, c := range cs {
		busy += c.Inbox.Outcomes.Get(inboxmw.OutcomeBusy)
	}
	if busy != 0 {
		t.Errorf("%d deliveries nacked as busy: a backoff outlasted the in-process wait", busy)
	}
	t.Logf("%d messages × %d runs through %d lanes in %s; gap before run 2: mean %s, max %s (bound 2 s); before run 3: mean %s, max %s (bound 4 s)",
		n, failures+1, lanes, elapsed.Round(time.Millisecond), m1.Round(time.Millisecond), slices.Max(gap1).Round(time.Millisecond),
		m2.Round(time.Millisecond), slices.Max(gap2).Round(time.Millisecond))
}

func mean(ds []time.Duration) time.Duration {
	var sum float64
	for _, d := range ds {
		sum += float64(d)
	}
	return time.Duration(math.Round(sum / float64(len(ds))))
}

// sharedStore is the store instance the in-process consumers of a case
// share: the case's own (memory), else one opened from its URL, closed when
// the test ends (rather than a connection pool per consumer).
func (e *env) sharedStore(t *testing.T) stores.Store {
	if e.store.Shared != nil {
		return e.store.Shared
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	s, err := stores.Open(ctx, e.spec.Store.URL)
	cancel()
	if err != nil {
		t.Fatalf("opening the store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
