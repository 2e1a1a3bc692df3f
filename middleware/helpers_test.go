package inboxmw_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// ledger counts every application of a handler's effect, per id, so "once"
// is measured.
type ledger struct {
	mu sync.Mutex
	n  map[string]int
}

func newLedger() *ledger { return &ledger{n: make(map[string]int)} }

func (l *ledger) apply(id string) {
	l.mu.Lock()
	l.n[id]++
	l.mu.Unlock()
}

func (l *ledger) count(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[id]
}

func (l *ledger) snapshot() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.n))
	for k, v := range l.n {
		out[k] = v
	}
	return out
}

// recorder is a inboxmw.Metrics that counts outcomes and store calls.
type recorder struct {
	mu       sync.Mutex
	outcomes map[inboxmw.Outcome]int
	calls    map[string]int
	waited   map[string]time.Duration
}

func newRecorder() *recorder {
	return &recorder{outcomes: make(map[inboxmw.Outcome]int), calls: make(map[string]int), waited: make(map[string]time.Duration)}
}

func (r *recorder) Outcome(_ string, o inboxmw.Outcome) {
	r.mu.Lock()
	r.outcomes[o]++
	r.mu.Unlock()
}

func (r *recorder) Waited(_, reason string, d time.Duration) {
	r.mu.Lock()
	r.waited[reason] += d
	r.mu.Unlock()
}

func (r *recorder) StoreCall(op string, _ time.Duration, _ error) {
	r.mu.Lock()
	r.calls[op]++
	r.mu.Unlock()
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.outcomes)
}

func (r *recorder) get(o inboxmw.Outcome) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.outcomes[o]
}

func (r *recorder) callCount(op string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[op]
}

// faultyStore wraps a LeaseStore with injectable failures.
type faultyStore struct {
	inbox.LeaseStore

	down           atomic.Bool  // every call fails with ErrStoreUnavailable
	failCompletes  atomic.Int32 // the next N Completes fail
	loseReplies    atomic.Int32 // the next N Completes land, then fail as if their reply was lost
	extendErr      atomic.Pointer[error]
	extendErrOnce  atomic.Bool // extendErr applies to the first lease only
	firstLease     atomic.Pointer[string]
	completeCtxErr atomic.Pointer[error] // ctx.Err() seen by the last Complete
	releases       atomic.Int32          // Releases and Fails: the lease given back
	failReleases   atomic.Int32          // the next N Releases or Fails fail
	tryBegins      atomic.Int32
	busyAnswers    atomic.Int32
	slowTryBegin   atomic.Int64 // the next TryBegin reaches the store this many ns late (a slow store under load)
}

var errDown = fmt.Errorf("%w: injected outage", inbox.ErrStoreUnavailable)

func newFaulty(t *testing.T) *faultyStore {
	return &faultyStore{LeaseStore: newMemory(t)}
}

func newMemory(t *testing.T) *memory.Store {
	t.Helper()
	s, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func (f *faultyStore) TryBegin(ctx context.Context, key string, o inbox.BeginOptions) (inbox.Claim, error) {
	f.tryBegins.Add(1)
	if f.down.Load() {
		return inbox.Claim{}, errDown
	}
	if d := time.Duration(f.slowTryBegin.Swap(0)); d > 0 {
		time.Sleep(d)
	}
	c, err := f.LeaseStore.TryBegin(ctx, key, o)
	if err == nil && c.Status == inbox.Acquired {
		id := c.LeaseID
		f.firstLease.CompareAndSwap(nil, &id)
	}
	if c.Status == inbox.Busy {
		f.busyAnswers.Add(1)
	}
	return c, err
}

func (f *faultyStore) Complete(ctx context.Context, key, leaseID string) error {
	e := ctx.Err()
	f.completeCtxErr.Store(&e)
	if f.down.Load() {
		return errDown
	}
	if f.failCompletes.Add(-1) >= 0 {
		return errDown
	}
	err := f.LeaseStore.Complete(ctx, key, leaseID)
	if err == nil && f.loseReplies.Add(-1) >= 0 {
		return fmt.Errorf("%w: connection reset before the reply", inbox.ErrStoreUnavailable)
	}
	return err
}

func (f *faultyStore) Release(ctx context.Context, key, leaseID string) error {
	f.releases.Add(1)
	if f.down.Load() || f.failReleases.Add(-1) >= 0 {
		return errDown
	}
	return f.LeaseStore.Release(ctx, key, leaseID)
}

func (f *faultyStore) Fail(ctx context.Context, key, leaseID string, o inbox.FailOptions) error {
	f.releases.Add(1)
	if f.down.Load() || f.failReleases.Add(-1) >= 0 {
		return errDown
	}
	return f.LeaseStore.Fail(ctx, key, leaseID, o)
}

func (f *faultyStore) Extend(ctx context.Context, key, leaseID string, d time.Duration) (time.Time, error) {
	if f.down.Load() {
		return time.Time{}, errDown
	}
	if p := f.extendErr.Load(); p != nil {
		if first := f.firstLease.Load(); !f.extendErrOnce.Load() || (first != nil && *first == leaseID) {
			return time.Time{}, *p
		}
	}
	return f.LeaseStore.Extend(ctx, key, leaseID, d)
}

func (f *faultyStore) setExtendErr(err error, firstLeaseOnly bool) {
	f.extendErrOnce.Store(firstLeaseOnly)
	f.extendErr.Store(&err)
}

// plainStore hides the lease methods: the middleware sees an inbox.Store.
type plainStore struct{ s inbox.Store }

func (p plainStore) IsProcessed(ctx context.Context, key string) (bool, error) {
	return p.s.IsProcessed(ctx, key)
}
func (p plainStore) MarkProcessed(ctx context.Context, key string) error {
	return p.s.MarkProcessed(ctx, key)
}

// newInbox builds the middleware with test defaults and closes it at the end.
func newInbox(t *testing.T, cfg inboxmw.Config) *inboxmw.Inbox {
	t.Helper()
	if cfg.Bus == "" {
		cfg.Bus = "test"
	}
	if cfg.Group == "" {
		cfg.Group = "g"
	}
	ib, err := inboxmw.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ib.Close(ctx); err != nil {
			t.Errorf("Inbox.Close: %v", err)
		}
	})
	return ib
}

func newPubSub(t *testing.T) *gochannel.GoChannel {
	t.Helper()
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 256}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	return ps
}

// startRouter runs a router with one handler consuming topic "orders" from
// sub, the inbox middleware inside any given outer middlewares, and stops it
// at the end of the test.
func startRouter(t *testing.T, sub message.Subscriber, pub message.Publisher, outputTopic string,
	ib *inboxmw.Inbox, h message.HandlerFunc, outer ...message.HandlerMiddleware) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range outer {
		r.AddMiddleware(m)
	}
	if ib != nil {
		r.AddMiddleware(ib.Middleware)
	}
	if pub == nil {
		r.AddConsumerHandler("orders-handler", "orders", sub, func(msg *message.Message) error {
			_, err := h(msg)
			return err
		})
	} else {
		r.AddHandler("orders-handler", "orders", sub, outputTopic, pub, h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			t.Errorf("router: %v", err)
		}
	}()
	select {
	case <-r.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("router did not start")
	}
	t.Cleanup(func() {
		cancel()
		_ = r.Close()
		<-done
	})
}

// order returns a message for order id with the IdempotencyKey header set,
// and a fresh UUID as a producer retry would have.
func order(id string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"`+id+`"}`))
	m.Metadata.Set("IdempotencyKey", id)
	return m
}

func publish(t *testing.T, pub message.Publisher, msgs ...*message.Message) {
	t.Helper()
	for _, m := range msgs {
		if err := pub.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
	}
}

// getRecord reads the store record of the key the middleware builds for
// order id under handler "orders-handler".
func getRecord(t *testing.T, s inbox.LeaseStore, id string) inbox.Record {
	t.Helper()
	r, err := s.Get(context.Background(), "test:g:orders-handler:"+id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var errBoom = errors.New("boom")

// logged reports whether logs captured msg at level.
func logged(logs *watermill.CaptureLoggerAdapter, level watermill.LogLevel, msg string) bool {
	for _, m := range logs.Captured()[level] {
		if m.Msg == msg {
			return true
		}
	}
	return false
}
