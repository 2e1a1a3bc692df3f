package inboxkafka_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// handlerTime is what the handler of the concurrency tests takes per copy.
const handlerTime = 100 * time.Millisecond

// copyLog records what a router of the concurrency tests saw: each copy
// delivered to the router (by UUID, before the inbox) and each copy whose
// handler ran to its end.
type copyLog struct {
	mu        sync.Mutex
	delivered map[string]int
	handled   map[string]int
	last      time.Time // when the last handler ended
}

func newCopyLog() *copyLog {
	return &copyLog{delivered: map[string]int{}, handled: map[string]int{}}
}

func (l *copyLog) handledCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.handled)
}

// startRouter runs a router that consumes topic through sub with the inbox
// on store and a handler that takes handlerTime. When fail is not nil, the
// handler first calls it with the message, and returns its error if any
// (the copy is then not handled). It returns a function that closes the
// router and the inbox (draining its marks), which the test's cleanup calls
// too.
func startRouter(t *testing.T, store inbox.LeaseStore, group, topic string, sub message.Subscriber, log *copyLog, fail func(*message.Message) error) (stop func()) {
	t.Helper()
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "kafka", Group: group})
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			log.mu.Lock()
			log.delivered[m.UUID]++
			log.mu.Unlock()
			return h(m)
		}
	}, ib.Middleware)
	router.AddConsumerHandler("charge", topic, sub, func(m *message.Message) error {
		if fail != nil {
			if err := fail(m); err != nil {
				return err
			}
		}
		time.Sleep(handlerTime) // the handler's work
		log.mu.Lock()
		log.handled[m.UUID]++
		log.last = time.Now()
		log.mu.Unlock()
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := router.Close(); err != nil {
				t.Errorf("closing the router: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := ib.Close(ctx); err != nil {
				t.Errorf("closing the inbox: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func newMemoryStore(t *testing.T) inbox.LeaseStore {
	t.Helper()
	store, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return store
}

// handOff hands n copies to topic's retry topics with wait, concurrently,
// and returns their UUIDs.
func handOff(t *testing.T, r *inboxkafka.Retry, topic string, n int, wait time.Duration) []string {
	t.Helper()
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		ids[i] = watermill.NewUUID()
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.Redeliver(t.Context(), topic, copyOf(ids[i], "", 1), wait)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Redeliver of copy %d: %v", i, err)
		}
	}
	return ids
}

// TestRetry_due_copies_of_one_partition_run_concurrently: 200 copies due on
// one delay of a one-partition retry topic, through a router with the inbox
// and a handler that takes 100 ms, are all handled within 3 s of the last
// one's due time (one at a time they would take 20 s): the partition
// delivers its due copies without waiting for the acks of those before
// them, up to the default RetryConfig.Concurrency.
func TestRetry_due_copies_of_one_partition_run_concurrently(t *testing.T) {
	t.Parallel()
	eachBroker(t, func(t *testing.T, env kafkaEnv) {
		topic, group := names(t)
		env.createTopic(t, topic, 1)
		const delay = time.Second
		r := newRetryWith(t, env, inboxkafka.RetryConfig{Brokers: env.brokers, ConsumerGroup: group, Topics: []string{topic},
			Delays: []time.Duration{delay}, Partitions: 1, SaramaConfig: saramaConfig()})
		log := newCopyLog()
		startRouter(t, newMemoryStore(t), group, topic, r.Subscriber(mainSubscriber(t, env, group)), log, nil)

		// A first copy, handled, says that the retry group reads the
		// partition.
		handOff(t, r, topic, 1, delay)
		testenv.Eventually(t, 60*time.Second, "the first copy handled", func() bool { return log.handledCount() == 1 })

		const n = 200
		ids := handOff(t, r, topic, n, delay)
		lastDue := time.Now().Add(delay + time.Millisecond) // a copy is due at most delay after its Redeliver began, rounded up to 1 ms
		const within = 3 * time.Second
		testenv.Eventually(t, time.Until(lastDue)+60*time.Second, "the 200 copies handled", func() bool { return log.handledCount() == n+1 })
		log.mu.Lock()
		defer log.mu.Unlock()
		took := log.last.Sub(lastDue)
		t.Logf("%d copies of %s each handled %s after the last one was due", n, handlerTime, took.Round(time.Millisecond))
		if took > within {
			t.Errorf("the %d copies were handled %s after the last one was due, want within %s", n, took.Round(time.Millisecond), within)
		}
		for _, id := range ids {
			if log.handled[id] != 1 {
				t.Errorf("copy %s handled %d times, want 1", id, log.handled[id])
			}
		}
	})
}

// TestRetry_killed_consumer_commits_only_past_acked_copies: a router
// consumes 200 due copies of a one-partition retry topic; the handler of
// the copy at offset 10 hangs until the router's subscriber is closed, then
// fails (the consumer died under it, before its effect). The router is
// closed once 100 copies were handled. The retry group's committed offset
// is then 10: past the acked copies before the hung one, not past it, though
// most copies behind it were acked. A successor router on the same store
// reads the partition from there: it handles the hung copy, the inbox drops
// the copies behind it that were handled already, and each copy's handler
// has run to its end exactly once.
func TestRetry_killed_consumer_commits_only_past_acked_copies(t *testing.T) {
	t.Parallel()
	eachBroker(t, func(t *testing.T, env kafkaEnv) {
		topic, group := names(t)
		env.createTopic(t, topic, 1)
		const delay = 250 * time.Millisecond
		r := newRetryWith(t, env, inboxkafka.RetryConfig{Brokers: env.brokers, ConsumerGroup: group, Topics: []string{topic},
			Delays: []time.Duration{delay}, Partitions: 1, SaramaConfig: saramaConfig()})
		store := newMemoryStore(t)
		const n, half, hung = 200, 100, 10
		ids := handOff(t, r, topic, n, delay)
		retryTopic := r.RetryTopics(topic)[0]
		order := readUUIDs(t, env, retryTopic, n)
		if !sameSet(order, ids) {
			t.Fatalf("the retry topic holds %d copies that are not the %d handed off", len(order), n)
		}

		first, second := newCopyLog(), newCopyLog()
		subClosed := make(chan struct{})
		sub := &closeNotifier{Subscriber: r.Subscriber(mainSubscriber(t, env, group)), closed: subClosed}
		stopFirst := startRouter(t, store, group, topic, sub, first, func(m *message.Message) error {
			if m.UUID != order[hung] {
				return nil
			}
			<-subClosed
			return errors.New("the consumer died under this copy")
		})
		testenv.Eventually(t, 60*time.Second, "half the copies handled by the first consumer", func() bool { return first.handledCount() >= half })
		stopFirst()

		committed := committedOffset(t, env, group+inboxkafka.RetryConsumerGroupSuffix, retryTopic)
		first.mu.Lock()
		behind := 0 // copies behind the hung one that were handled
		for _, id := range order[hung+1:] {
			behind += first.handled[id]
		}
		t.Logf("first consumer: %d copies handled, %d of them behind the hung copy at offset %d; offset %d committed", len(first.handled), behind, hung, committed)
		for _, id := range order[:hung] {
			if first.handled[id] != 1 {
				t.Errorf("copy %s, before the hung one, handled %d times by the first consumer, want once", id, first.handled[id])
			}
		}
		first.mu.Unlock()
		if committed != hung {
			t.Fatalf("the retry group's committed offset is %d, want %d: past the acked copies before the hung one, not past it", committed, hung)
		}

		startRouter(t, store, group, topic, r.Subscriber(mainSubscriber(t, env, group)), second, nil)
		testenv.Eventually(t, 60*time.Second, "every copy handled, and those handled before delivered again", func() bool {
			first.mu.Lock()
			defer first.mu.Unlock()
			second.mu.Lock()
			defer second.mu.Unlock()
			for off, id := range order {
				if first.handled[id]+second.handled[id] == 0 || off >= hung && second.delivered[id] == 0 {
					return false
				}
			}
			return true
		})
		first.mu.Lock()
		defer first.mu.Unlock()
		second.mu.Lock()
		defer second.mu.Unlock()
		dropped := 0
		for _, id := range order {
			if runs := first.handled[id] + second.handled[id]; runs != 1 {
				t.Errorf("copy %s handled %d times (%d by the first consumer, %d by its successor), want once", id, runs, first.handled[id], second.handled[id])
			}
			if first.handled[id] == 1 && second.delivered[id] > 0 {
				dropped++
			}
		}
		if second.handled[order[hung]] != 1 {
			t.Errorf("the hung copy was handled %d times by the successor, want once", second.handled[order[hung]])
		}
		t.Logf("successor: %d copies handled, %d delivered again and dropped by the inbox", len(second.handled), dropped)
	})
}

// closeNotifier closes closed once its Subscriber closed.
type closeNotifier struct {
	message.Subscriber
	closed chan struct{}
	once   sync.Once
}

func (c *closeNotifier) Close() error {
	err := c.Subscriber.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}

// committedOffset is group's committed offset of partition 0 of topic.
func committedOffset(t *testing.T, env kafkaEnv, group, topic string) int64 {
	t.Helper()
	admin := env.admin(t)
	defer admin.Close()
	res, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: {0}})
	if err != nil {
		t.Fatalf("reading the offsets of group %s: %v", group, err)
	}
	b := res.GetBlock(topic, 0)
	if b == nil {
		t.Fatalf("group %s has no offset for %s/0", group, topic)
	}
	return b.Offset
}

// readUUIDs reads the first n records of partition 0 of topic and returns
// their message UUIDs, by offset.
func readUUIDs(t *testing.T, env kafkaEnv, topic string, n int) []string {
	t.Helper()
	consumer, err := sarama.NewConsumer(env.brokers, saramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ids := make([]string, 0, n)
	for len(ids) < n {
		select {
		case km := <-pc.Messages():
			if km.Offset != int64(len(ids)) {
				t.Fatalf("read offset %d of %s, want %d", km.Offset, topic, len(ids))
			}
			m, err := kafka.DefaultMarshaler{}.Unmarshal(km)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, m.UUID)
		case <-time.After(60 * time.Second):
			t.Fatalf("read %d records of %s in 60 s, want %d", len(ids), topic, n)
		}
	}
	return ids
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
