package redisstore_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

// The conformance suite with pipelined marks: every Complete waits for the
// next TryBegin of its store, or 2 ms.
func TestConformance_completeDelay(t *testing.T) {
	c := sharedClient(t)
	prefix := testPrefix(t, c)
	h := harness(t, c)
	h.New = func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
		s, err := redisstore.New(c, redisstore.Options{Prefix: prefix, Retention: cfg.Retention, CompleteDelay: 2 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	storetest.Run(t, h)
}

// delayed returns a store on the shared Redis whose marks wait up to delay
// (a minute: only what the test does sends them), and a plain store on the
// same keys to look at them without sending marks.
func delayed(t *testing.T, delay time.Duration) (*redisstore.Store, *redisstore.Store) {
	t.Helper()
	c := sharedClient(t)
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix, CompleteDelay: redisstore.MaxCompleteDelay})
	redisstore.SetCompleteDelay(s, delay)
	plain := newStore(t, c, redisstore.Options{Prefix: prefix})
	return s, plain
}

func acquire(t *testing.T, s inbox.LeaseStore, key string) inbox.Claim {
	t.Helper()
	c, err := s.TryBegin(context.Background(), key, inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin(%q) = %+v, %v; want Acquired", key, c, err)
	}
	return c
}

func state(t *testing.T, s inbox.LeaseStore, key string) inbox.State {
	t.Helper()
	r, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return r.State
}

// completeAsync starts Complete and returns where its result will arrive.
func completeAsync(ctx context.Context, s inbox.LeaseStore, key, leaseID string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Complete(ctx, key, leaseID) }()
	return done
}

func waitPending(t *testing.T, s *redisstore.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for redisstore.PendingMarks(s) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d marks pending after 10s, want %d", redisstore.PendingMarks(s), n)
		}
		time.Sleep(time.Millisecond) // polling interval
	}
}

func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Complete did not return within 10s")
		return nil
	}
}

func TestCompleteDelay_mark_rides_with_the_next_TryBegin(t *testing.T) {
	t.Parallel()
	s, plain := delayed(t, time.Minute)
	c := acquire(t, s, "first")
	done := completeAsync(context.Background(), s, "first", c.LeaseID)
	waitPending(t, s, 1)
	if got := state(t, plain, "first"); got != inbox.StateInProgress {
		t.Fatalf("state before the next TryBegin = %v, want InProgress (the mark waits)", got)
	}
	acquire(t, s, "second") // carries the mark
	if err := result(t, done); err != nil {
		t.Fatalf("Complete = %v", err)
	}
	if got := state(t, plain, "first"); got != inbox.StateProcessed {
		t.Fatalf("state after the next TryBegin = %v, want Processed", got)
	}
	if n := redisstore.PendingMarks(s); n != 0 {
		t.Fatalf("%d marks still pending", n)
	}
}

func TestCompleteDelay_duplicate_in_the_same_pipeline_sees_processed(t *testing.T) {
	t.Parallel()
	s, _ := delayed(t, time.Minute)
	c := acquire(t, s, "k")
	done := completeAsync(context.Background(), s, "k", c.LeaseID)
	waitPending(t, s, 1)
	// The redelivery's claim travels after the mark of its first delivery.
	got, err := s.TryBegin(context.Background(), "k", inbox.BeginOptions{})
	if err != nil || got.Status != inbox.Processed {
		t.Fatalf("TryBegin of the duplicate = %+v, %v; want Processed", got, err)
	}
	if err := result(t, done); err != nil {
		t.Fatalf("Complete = %v", err)
	}
}

func TestCompleteDelay_alone_goes_after_the_delay(t *testing.T) {
	t.Parallel()
	const delay = 30 * time.Millisecond
	s, plain := delayed(t, delay)
	c := acquire(t, s, "k")
	start := time.Now()
	if err := s.Complete(context.Background(), "k", c.LeaseID); err != nil {
		t.Fatalf("Complete = %v", err)
	}
	if took := time.Since(start); took < delay {
		t.Errorf("Complete returned after %s, before the delay %s with no TryBegin to carry it", took, delay)
	}
	if got := state(t, plain, "k"); got != inbox.StateProcessed {
		t.Fatalf("state = %v, want Processed", got)
	}
}

func TestCompleteDelay_each_mark_gets_its_own_result(t *testing.T) {
	t.Parallel()
	s, plain := delayed(t, time.Minute)
	good := acquire(t, s, "good")
	acquire(t, s, "taken")
	okDone := completeAsync(context.Background(), s, "good", good.LeaseID)
	lostDone := completeAsync(context.Background(), s, "taken", "not-the-holder")
	waitPending(t, s, 2)
	acquire(t, s, "carrier")
	if err := result(t, okDone); err != nil {
		t.Errorf("Complete by the holder = %v", err)
	}
	if err := result(t, lostDone); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Errorf("Complete by another lease = %v, want ErrLeaseLost", err)
	}
	if got := state(t, plain, "taken"); got != inbox.StateInProgress {
		t.Errorf("key completed by a lease that did not hold it: state %v", got)
	}
}

func TestCompleteDelay_full_batch_goes_at_once(t *testing.T) {
	t.Parallel()
	s, plain := delayed(t, time.Minute)
	const n = 128 // the batch limit
	leases := make([]string, n)
	for i := range n { // all claims first: a TryBegin would carry the marks
		leases[i] = acquire(t, s, "k"+strconv.Itoa(i)).LeaseID
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- s.Complete(context.Background(), "k"+strconv.Itoa(i), leases[i]) }()
	}
	wg.Wait() // no TryBegin and a minute's delay: only the full batch sends them
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Complete = %v", err)
		}
	}
	for i := range n {
		if got := state(t, plain, "k"+strconv.Itoa(i)); got != inbox.StateProcessed {
			t.Fatalf("k%d is %v, want Processed", i, got)
		}
	}
}

func TestCompleteDelay_canceled_caller_mark_still_goes(t *testing.T) {
	t.Parallel()
	s, plain := delayed(t, time.Minute)
	c := acquire(t, s, "k")
	ctx, cancel := context.WithCancel(context.Background())
	done := completeAsync(ctx, s, "k", c.LeaseID)
	waitPending(t, s, 1)
	cancel()
	if err := result(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Complete with a canceled context = %v, want context.Canceled", err)
	}
	acquire(t, s, "carrier")
	if got := state(t, plain, "k"); got != inbox.StateProcessed {
		t.Fatalf("state = %v, want Processed: a queued mark is sent even when its caller went away", got)
	}
	// The caller's retry, by the same lease, succeeds.
	done = completeAsync(context.Background(), s, "k", c.LeaseID)
	waitPending(t, s, 1)
	acquire(t, s, "carrier-2")
	if err := result(t, done); err != nil {
		t.Fatalf("repeated Complete = %v", err)
	}
}

func TestCompleteDelay_Close_sends_pending_marks(t *testing.T) {
	t.Parallel()
	s, plain := delayed(t, time.Minute)
	c := acquire(t, s, "k")
	done := completeAsync(context.Background(), s, "k", c.LeaseID)
	waitPending(t, s, 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatalf("Complete pending at Close = %v", err)
	}
	if got := state(t, plain, "k"); got != inbox.StateProcessed {
		t.Fatalf("state = %v, want Processed", got)
	}
	if err := s.Complete(context.Background(), "k", c.LeaseID); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("Complete after Close = %v, want ErrClosed", err)
	}
}

// A fresh server has no scripts cached: the pipeline's EVALSHA of Complete
// answers NOSCRIPT, and the store runs it again with EVAL.
func TestCompleteDelay_fresh_server_without_scripts(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Options{Prefix: "t:", CompleteDelay: redisstore.MaxCompleteDelay})
	redisstore.SetCompleteDelay(s, time.Minute)
	first := acquire(t, s, "first") // loads the TryBegin script only
	done := completeAsync(context.Background(), s, "first", first.LeaseID)
	waitPending(t, s, 1)
	acquire(t, s, "second")
	if err := result(t, done); err != nil {
		t.Fatalf("Complete = %v", err)
	}
	if got := state(t, s, "first"); got != inbox.StateProcessed {
		t.Fatalf("state = %v, want Processed", got)
	}
	// And when the cache is emptied under a running store.
	if err := c.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	second := acquire(t, s, "third")
	done = completeAsync(context.Background(), s, "third", second.LeaseID)
	waitPending(t, s, 1)
	if err := c.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, "fourth")
	if err := result(t, done); err != nil {
		t.Fatalf("Complete after SCRIPT FLUSH = %v", err)
	}
}

func TestCompleteDelay_Redis_down_fails_marks_with_ErrStoreUnavailable(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Options{Prefix: "t:", CompleteDelay: redisstore.MaxCompleteDelay, Timeout: 2 * time.Second})
	redisstore.SetCompleteDelay(s, time.Minute)
	first := acquire(t, s, "first")
	done := completeAsync(context.Background(), s, "first", first.LeaseID)
	waitPending(t, s, 1)
	srv.Kill()
	_, err := s.TryBegin(context.Background(), "second", inbox.BeginOptions{})
	if !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Errorf("TryBegin with Redis down = %v, want ErrStoreUnavailable", err)
	}
	if err := result(t, done); !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Errorf("Complete carried by it = %v, want ErrStoreUnavailable", err)
	}
}

func TestOpenURL_complete_delay(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	prefix := testPrefix(t, c)
	ctx := context.Background()
	s, err := stores.Open(ctx, withQuery(t, testenv.Redis.URL(t), "prefix="+url.QueryEscape(prefix)+"&complete_delay=20ms&timeout=2s"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rs := s.(*redisstore.Store)
	if o := redisstore.OptionsOf(rs); o.CompleteDelay != 20*time.Millisecond || o.Timeout != 2*time.Second {
		t.Fatalf("CompleteDelay, Timeout = %s, %s; want 20ms, 2s", o.CompleteDelay, o.Timeout)
	}
	cl := acquire(t, s, "k")
	if err := s.Complete(ctx, "k", cl.LeaseID); err != nil { // sent when the 20 ms have passed
		t.Fatalf("Complete = %v", err)
	}
	if got := state(t, s, "k"); got != inbox.StateProcessed {
		t.Fatalf("state = %v, want Processed", got)
	}
}

func TestCompleteDelay_validation(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	for _, d := range []time.Duration{-time.Millisecond, redisstore.MaxCompleteDelay + 1} {
		if _, err := redisstore.New(c, redisstore.Options{CompleteDelay: d}); !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("CompleteDelay %s: %v, want ErrInvalidArgument", d, err)
		}
	}
	for _, d := range []time.Duration{0, time.Nanosecond, redisstore.MaxCompleteDelay} {
		s := newStore(t, c, redisstore.Options{CompleteDelay: d})
		if got := redisstore.OptionsOf(s).CompleteDelay; got != d {
			t.Errorf("CompleteDelay %s: the store has %s", d, got)
		}
	}
}

// The middleware over a store with pipelined marks: every message is handled
// once, duplicates are skipped, and Close of the middleware then of the store
// leaves every key processed.
func TestMiddleware_completeDelay_processes_each_message_once(t *testing.T) {
	t.Parallel()
	s, plain := delayed(t, 5*time.Millisecond)
	ib, err := inboxmw.New(inboxmw.Config{Store: s, Bus: "b", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	router.AddMiddleware(ib.Middleware)
	router.AddConsumerHandler("h", "in", pubSub, func(m *message.Message) error {
		mu.Lock()
		runs[m.UUID]++
		mu.Unlock()
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	const n = 50
	for i := range n {
		for range 2 { // each message twice: the copy must be skipped
			if err := pubSub.Publish("in", message.NewMessage("m"+strconv.Itoa(i), []byte("x"))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := router.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ib.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		id := "m" + strconv.Itoa(i)
		if runs[id] != 1 {
			t.Errorf("%s handled %d times, want 1", id, runs[id])
		}
		if got := state(t, plain, "b:g:h:"+id); got != inbox.StateProcessed {
			t.Errorf("%s is %v, want Processed", id, got)
		}
	}
}
