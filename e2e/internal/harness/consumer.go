package harness

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores"
)

// Crash points of a consumer's handler.
const (
	CrashBeforeEffect = "before-effect"
	CrashAfterEffect  = "after-effect"
)

// StoreSpec says which inbox a consumer uses: the leased middleware over the
// store at URL (Mode ""), or a mode registered with [RegisterMode] (the SQL
// transactional middleware, "tx").
type StoreSpec struct {
	URL  string `json:"url"`
	Mode string `json:"mode,omitempty"`
}

// ConsumerSpec is everything a consumer process needs; it travels to child
// processes as JSON.
type ConsumerSpec struct {
	Broker  BrokerSpec `json:"broker"`
	Dest    string     `json:"dest"`
	Group   string     `json:"group"`
	Handler string     `json:"handler"`
	Store   StoreSpec  `json:"store"`
	// Ledger is the path of the file ledger; empty when the mode writes the
	// effect elsewhere (the transactional mode's ledger table).
	Ledger string `json:"ledger,omitempty"`

	Lease        time.Duration `json:"lease,omitempty"`
	MaxBusyWait  time.Duration `json:"max_busy_wait,omitempty"`
	StoreTimeout time.Duration `json:"store_timeout,omitempty"`

	// FailRate is the share of handler calls that fail before the effect.
	FailRate float64 `json:"fail_rate,omitempty"`
	// Work bounds a random pause in the handler before the effect (the
	// handler's own work), so that deliveries overlap.
	Work time.Duration `json:"work,omitempty"`

	// CrashID names the message (payload) at which the process kills itself
	// with SIGKILL, at CrashAt.
	CrashID string `json:"crash_id,omitempty"`
	CrashAt string `json:"crash_at,omitempty"`

	// RejectMissing selects inboxmw.MissingKeyReject.
	RejectMissing bool `json:"reject_missing,omitempty"`
	// Poison is the destination of a poison queue outside the inbox, for
	// the errors that are not transient (inboxmw.IsTransient).
	Poison string `json:"poison,omitempty"`

	// MaxAttempts is inboxmw.Config.MaxAttempts (the default Backoff).
	MaxAttempts int `json:"max_attempts,omitempty"`
	// FailIDs are messages (payloads) whose handler fails every time, with
	// ErrPoison, until [Consumer.Heal].
	FailIDs []string `json:"fail_ids,omitempty"`
	// FailFirst makes the first FailFirst handler runs of every message fail
	// (runs counted per payload in Runs).
	FailFirst int `json:"fail_first,omitempty"`
	// FailFirstOneIn makes the first attempt of about one message in
	// FailFirstOneIn fail: the deliveries of a message chosen by a hash of
	// its payload (the same in every process) fail, before the effect,
	// until one carries a count of failed attempts (inboxmw.MetadataAttempts
	// above 0: a copy handed back after the store recorded a failure).
	FailFirstOneIn int `json:"fail_first_one_in,omitempty"`
	// OrderKey selects inboxmw.Config.OrderKey: OrderByRecordKey (Kafka's
	// record key, inboxkafka.OrderByRecordKey) or the name of a metadata
	// field. Empty: none.
	OrderKey string `json:"order_key,omitempty"`
	// LedgerPID writes the process id after the payload on each ledger
	// line ("<payload> <pid>"), so that the ledger says who applied what.
	LedgerPID bool `json:"ledger_pid,omitempty"`
	// Runs logs the handler's runs; in-process consumers given the same
	// one share it (FailFirst then counts all their runs of a message).
	// Nil: the consumer makes its own.
	Runs *RunLog `json:"-"`

	// Redeliver hands failed attempts to the broker's redelivery
	// (inboxamqp.Delays, inboxkafka.Retry: inboxmw.Config.Redelivery).
	Redeliver bool `json:"redeliver,omitempty"`
	// Backoff, when set, is a fixed inboxmw.Config.Backoff (else the
	// default).
	Backoff time.Duration `json:"backoff,omitempty"`
	// Redelivery is the Redeliverer the consumer made for Redeliver, for
	// the modes to put in their inboxmw.Config (set by NewConsumer).
	Redelivery inboxmw.Redeliverer `json:"-"`
	// Handoffs logs the hand-offs to Redelivery; in-process consumers given
	// the same one share it. Nil: the consumer makes its own.
	Handoffs *HandoffLog `json:"-"`
}

// OrderByRecordKey is the ConsumerSpec.OrderKey of inboxkafka.OrderByRecordKey.
const OrderByRecordKey = "record-key"

// OrderKeyFunc is the inboxmw.Config.OrderKey of the spec (nil for none).
func (s ConsumerSpec) OrderKeyFunc() func(*message.Message) (string, error) {
	switch s.OrderKey {
	case "":
		return nil
	case OrderByRecordKey:
		return inboxkafka.OrderByRecordKey
	}
	field := s.OrderKey
	return func(m *message.Message) (string, error) { return m.Metadata.Get(field), nil }
}

// failsFirst reports whether the first attempt of the message (payload) id
// fails under FailFirstOneIn.
func (s ConsumerSpec) failsFirst(id string) bool {
	if s.FailFirstOneIn <= 0 {
		return false
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return h.Sum32()%uint32(s.FailFirstOneIn) == 0
}

// BackoffFunc is the inboxmw.Config.Backoff of the spec: nil for the
// default, else the fixed Backoff.
func (s ConsumerSpec) BackoffFunc() func(int) time.Duration {
	if s.Backoff <= 0 {
		return nil
	}
	return func(int) time.Duration { return s.Backoff }
}

// RunLog records the handler's runs, by message (payload), and which
// messages fail every time (ConsumerSpec.FailIDs, until healed).
type RunLog struct {
	mu     sync.Mutex
	runs   map[string][]time.Time // start of every run
	healed map[string]bool
}

// NewRunLog returns an empty RunLog.
func NewRunLog() *RunLog {
	return &RunLog{runs: map[string][]time.Time{}, healed: map[string]bool{}}
}

// start records a run of id starting now and returns its number (from 1)
// and whether id is healed.
func (r *RunLog) start(id string) (run int, healed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[id] = append(r.runs[id], time.Now())
	return len(r.runs[id]), r.healed[id]
}

// Runs returns the start times of the runs of the message (payload) id, in
// order.
func (r *RunLog) Runs(id string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.runs[id])
}

// Heal makes the handler of the message (payload) id, one of
// ConsumerSpec.FailIDs, succeed from now on: the bug is fixed.
func (r *RunLog) Heal(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.healed[id] = true
}

// IDSources are the id sources of every consumer: the IdempotencyKey
// metadata field, on RabbitMQ the AMQP message-id property, then the
// Watermill UUID.
func (s ConsumerSpec) IDSources() []keying.IDSource {
	src := []keying.IDSource{keying.FromMetadata(keying.DefaultIDMetadataKey)}
	if s.Broker.Kind == Rabbit {
		src = append(src, inboxamqp.FromMessageID())
	}
	return append(src, keying.FromUUID())
}

// MissingKey is the middleware's policy for messages without an id.
func (s ConsumerSpec) MissingKey() inboxmw.MissingKeyPolicy {
	if s.RejectMissing {
		return inboxmw.MissingKeyReject
	}
	return inboxmw.MissingKeyProcess
}

// Key returns the inbox key of a message with the given IdempotencyKey, as
// the consumers compute it (hashed when too long or not valid).
func (s ConsumerSpec) Key(idempotencyKey string) string {
	msg := message.NewMessage("", nil)
	msg.Metadata.Set(keying.DefaultIDMetadataKey, idempotencyKey)
	b := keying.Builder{Bus: s.Broker.Bus(), Group: s.Group, Alias: keying.StaticAlias(s.Handler), IDSources: s.IDSources()}
	k, _, err := b.KeyString(msg)
	if err != nil {
		panic(fmt.Sprintf("key of %q: %v", idempotencyKey, err))
	}
	return k
}

// Inbox is a consumer's idempotency layer, as a mode builds it.
type Inbox struct {
	// Middleware is the inbox middleware.
	Middleware message.HandlerMiddleware
	// Effect applies a message's effect once (one ledger line or row).
	Effect func(msg *message.Message, id string) error
	// Store reads records (may be nil).
	Store inbox.LeaseStore
	// Outcomes counts the middleware's outcomes (nil when it has no metrics).
	Outcomes *Outcomes
	// Close drains and closes, after the router stopped.
	Close func(ctx context.Context) error
}

// ModeFunc builds the inbox of a mode from the spec.
type ModeFunc func(ctx context.Context, spec ConsumerSpec) (*Inbox, error)

var modes = map[string]ModeFunc{}

// RegisterMode makes StoreSpec.Mode name select f. Call it from TestMain or
// init, before any consumer starts.
func RegisterMode(name string, f ModeFunc) { modes[name] = f }

// leaseInbox builds the leased middleware over a store opened from the URL
// (or over shared, the instance in-process consumers share).
func leaseInbox(ctx context.Context, spec ConsumerSpec, shared stores.Store) (*Inbox, error) {
	store := shared
	owned := false
	if store == nil {
		var err error
		store, err = stores.Open(ctx, spec.Store.URL)
		if err != nil {
			return nil, err
		}
		owned = true
	}
	led := &FileLedger{Path: spec.Ledger}
	line := func(id string) string { return id }
	if spec.LedgerPID {
		pid := strconv.Itoa(os.Getpid())
		line = func(id string) string { return id + " " + pid }
	}
	outcomes := &Outcomes{}
	ib, err := inboxmw.New(inboxmw.Config{
		Store:        store,
		Bus:          spec.Broker.Bus(),
		Group:        spec.Group,
		IDSources:    spec.IDSources(),
		Lease:        spec.Lease,
		MaxBusyWait:  spec.MaxBusyWait,
		StoreTimeout: spec.StoreTimeout,
		MissingKey:   spec.MissingKey(),
		MaxAttempts:  spec.MaxAttempts,
		Redelivery:   spec.Redelivery,
		Backoff:      spec.BackoffFunc(),
		OrderKey:     spec.OrderKeyFunc(),
		Metrics:      outcomes,
		Logger:       outcomes.Logger(),
	})
	if err != nil {
		if owned {
			_ = store.Close()
		}
		return nil, err
	}
	return &Inbox{
		Middleware: ib.Middleware,
		Effect:     func(_ *message.Message, id string) error { return led.Apply(line(id)) },
		Store:      store,
		Outcomes:   outcomes,
		Close: func(ctx context.Context) error {
			err := ib.Close(ctx)
			if owned {
				err = errors.Join(err, store.Close())
			}
			return errors.Join(err, led.Close())
		},
	}, nil
}

// Outcomes counts the middleware's outcomes, store calls and log lines: a
// inboxmw.Metrics, and through Logger its logger.
type Outcomes struct {
	mu     sync.Mutex
	n      map[inboxmw.Outcome]int
	calls  atomic.Int64
	errors atomic.Int64 // error lines
	lines  atomic.Int64 // lines at info or error level
}

// Outcome implements inboxmw.Metrics.
func (o *Outcomes) Outcome(_ string, oc inboxmw.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[inboxmw.Outcome]int{}
	}
	o.n[oc]++
}

// StoreCall implements inboxmw.Metrics.
func (o *Outcomes) StoreCall(string, time.Duration, error) { o.calls.Add(1) }

// Waited implements inboxmw.Metrics.
func (o *Outcomes) Waited(string, string, time.Duration) {}

// Calls is the number of store calls the middleware made.
func (o *Outcomes) Calls() int64 { return o.calls.Load() }

// Lines is the number of lines the middleware logged at info or error
// level, and how many of them at error level.
func (o *Outcomes) Lines() (all, errors int64) { return o.lines.Load(), o.errors.Load() }

// Logger is a logger for the middleware that counts its lines in o.
func (o *Outcomes) Logger() watermill.LoggerAdapter { return lineCounter{o} }

type lineCounter struct{ o *Outcomes }

func (l lineCounter) Error(string, error, watermill.LogFields) {
	l.o.errors.Add(1)
	l.o.lines.Add(1)
}
func (l lineCounter) Info(string, watermill.LogFields)                 { l.o.lines.Add(1) }
func (l lineCounter) Debug(string, watermill.LogFields)                {}
func (l lineCounter) Trace(string, watermill.LogFields)                {}
func (l lineCounter) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// Get returns the count of oc.
func (o *Outcomes) Get(oc inboxmw.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[oc]
}

// String lists the counts.
func (o *Outcomes) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprint(o.n)
}

// Probe is the outermost middleware of a consumer: it sees every delivery's
// result as the router does.
type Probe struct {
	acked, failed, storeFailed, injected, violations atomic.Int64

	mu       sync.Mutex
	failedBy map[string]int // deliveries nacked, by payload
}

type ranKey struct{}

// Acked is the number of deliveries the router acked (the handler chain
// returned no error).
func (p *Probe) Acked() int64 { return p.acked.Load() }

// Failed is the number of deliveries that returned an error (nacked).
func (p *Probe) Failed() int64 { return p.failed.Load() }

// StoreFailed is the number of deliveries nacked with an error wrapping
// inbox.ErrStoreUnavailable.
func (p *Probe) StoreFailed() int64 { return p.storeFailed.Load() }

// Injected is the number of handler calls that failed on purpose.
func (p *Probe) Injected() int64 { return p.injected.Load() }

// Violations is the number of deliveries nacked for a store failure whose
// handler ran anyway.
func (p *Probe) Violations() int64 { return p.violations.Load() }

// FailedFor is the number of deliveries of the message (payload) id that
// returned an error (nacked).
func (p *Probe) FailedFor(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failedBy[id]
}

func (p *Probe) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ran := new(atomic.Bool)
		msg.SetContext(context.WithValue(msg.Context(), ranKey{}, ran))
		out, err := h(msg)
		if err != nil {
			p.mu.Lock()
			if p.failedBy == nil {
				p.failedBy = map[string]int{}
			}
			p.failedBy[string(msg.Payload)]++
			p.mu.Unlock()
		}
		switch {
		case err == nil:
			p.acked.Add(1)
		case errors.Is(err, inbox.ErrStoreUnavailable):
			p.failed.Add(1)
			p.storeFailed.Add(1)
			if ran.Load() {
				p.violations.Add(1)
			}
		default:
			p.failed.Add(1)
		}
		return out, err
	}
}

var errInjected = errors.New("e2e: injected handler failure (before the effect)")

// ErrPoison is the error of the handler of a message of ConsumerSpec.FailIDs.
var ErrPoison = errors.New("e2e: poison message, the handler always fails")

// errFailFirst is the error of the first ConsumerSpec.FailFirst runs.
var errFailFirst = errors.New("e2e: this run fails on purpose (FailFirst)")

// Consumer is a router consuming one destination through an inbox.
type Consumer struct {
	Spec  ConsumerSpec
	Probe *Probe
	Inbox *Inbox

	router   *message.Router
	closers  []func() error
	done     chan error
	stopOnce sync.Once
	stopped  atomic.Bool
	stopErr  error
}

// NewConsumer builds (does not start) a consumer. shared, when not nil, is
// the store instance to use instead of opening spec.Store.URL (the memory
// store, which cannot be reached from elsewhere).
func NewConsumer(ctx context.Context, spec ConsumerSpec, shared stores.Store) (*Consumer, error) {
	var (
		ib  *Inbox
		err error
		red *redelivery
	)
	if spec.Redeliver {
		if spec.Handoffs == nil {
			spec.Handoffs = &HandoffLog{}
		}
		if red, err = newRedelivery(ctx, spec); err != nil {
			return nil, fmt.Errorf("redelivery: %w", err)
		}
		spec.Redelivery = red
	}
	if spec.Store.Mode == "" {
		ib, err = leaseInbox(ctx, spec, shared)
	} else if f, ok := modes[spec.Store.Mode]; ok {
		ib, err = f(ctx, spec)
	} else {
		err = fmt.Errorf("unknown store mode %q", spec.Store.Mode)
	}
	if err != nil {
		if red != nil {
			_ = red.close()
		}
		return nil, fmt.Errorf("building the inbox: %w", err)
	}
	c := &Consumer{Spec: spec, Probe: &Probe{}, Inbox: ib, done: make(chan error, 1)}
	if red != nil {
		c.closers = append(c.closers, red.close) // after the router and the inbox
	}
	if c.Spec.Runs == nil {
		c.Spec.Runs = NewRunLog()
	}
	fail := func(err error) (*Consumer, error) {
		_ = ib.Close(context.Background())
		for _, f := range c.closers {
			_ = f()
		}
		return nil, err
	}
	sub, err := spec.Broker.Subscriber(spec.Group)
	if err != nil {
		return fail(fmt.Errorf("subscriber: %w", err))
	}
	if red != nil {
		sub = red.subscriber(sub)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return fail(err)
	}
	router.AddMiddleware(c.Probe.middleware)
	if spec.Poison != "" {
		pub, err := spec.Broker.Publisher()
		if err != nil {
			return fail(fmt.Errorf("poison publisher: %w", err))
		}
		c.closers = append(c.closers, pub.Close)
		poison, err := wmw.PoisonQueueWithFilter(pub, spec.Poison, func(err error) bool { return !inboxmw.IsTransient(err) })
		if err != nil {
			_ = pub.Close()
			return fail(err)
		}
		router.AddMiddleware(poison)
	}
	router.AddMiddleware(ib.Middleware)
	router.AddConsumerHandler(spec.Handler, spec.Dest, sub, (&handler{c: c, ib: ib}).handle)
	c.router = router
	return c, nil
}

// handler is a consumer's handler: it applies the message's effect, with
// injected failures and crashes.
type handler struct {
	c  *Consumer
	ib *Inbox

	mu       sync.Mutex
	calls    int
	injected int
	done     []string // keys of the messages this process applied, in order
}

func (h *handler) handle(msg *message.Message) error {
	spec := h.c.Spec
	id := string(msg.Payload)
	if ran, ok := msg.Context().Value(ranKey{}).(*atomic.Bool); ok {
		ran.Store(true)
	}
	run, healed := spec.Runs.start(id)
	if !healed && slices.Contains(spec.FailIDs, id) {
		return ErrPoison
	}
	if run <= spec.FailFirst {
		return errFailFirst
	}
	if spec.failsFirst(id) {
		if n, _ := strconv.Atoi(msg.Metadata.Get(inboxmw.MetadataAttempts)); n == 0 {
			h.c.Probe.injected.Add(1)
			return errFailFirst
		}
	}
	if spec.Work > 0 {
		time.Sleep(rand.N(spec.Work)) // the handler's own work
	}
	if spec.FailRate > 0 {
		h.mu.Lock()
		h.calls++
		// Random failures at FailRate, and at least one in any consumer that
		// handles four messages, so the path is always taken.
		fail := rand.Float64() < spec.FailRate || (h.calls == 4 && h.injected == 0)
		if fail {
			h.injected++
		}
		h.mu.Unlock()
		if fail {
			h.c.Probe.injected.Add(1)
			return errInjected
		}
	}
	if id == spec.CrashID && spec.CrashAt == CrashBeforeEffect {
		h.crash()
	}
	if err := h.ib.Effect(msg, id); err != nil {
		return err
	}
	if id == spec.CrashID && spec.CrashAt == CrashAfterEffect {
		h.crash()
	}
	if spec.CrashID != "" {
		h.mu.Lock()
		h.done = append(h.done, spec.Key(msg.Metadata.Get(keying.DefaultIDMetadataKey)))
		h.mu.Unlock()
	}
	return nil
}

// crash kills the process with SIGKILL, once the marks of the messages it
// applied before have landed (they were acked; a mark follows its ack
// asynchronously): the crash then hits exactly this message's handler.
func (h *handler) crash() {
	h.mu.Lock()
	keys := append([]string(nil), h.done...)
	h.mu.Unlock()
	if h.ib.Store != nil && h.c.Spec.Store.Mode == "" {
		deadline := time.Now().Add(20 * time.Second)
		for _, k := range keys {
			for {
				rec, err := h.ib.Store.Get(context.Background(), k)
				if err == nil && rec.State == inbox.StateProcessed {
					break
				}
				if time.Now().After(deadline) {
					fmt.Fprintf(os.Stderr, "e2e child: key %q still not processed before the crash: %v %v\n", k, rec.State, err)
					os.Exit(4)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// Runs returns the start times of the handler's runs for the message
// (payload) id, in order (in every consumer sharing Spec.Runs).
func (c *Consumer) Runs(id string) []time.Time { return c.Spec.Runs.Runs(id) }

// Run runs the router until Stop; it returns when the router is running.
func (c *Consumer) Run() error {
	go func() { c.done <- c.router.Run(context.Background()) }()
	select {
	case <-c.router.Running():
		return nil
	case err := <-c.done:
		return fmt.Errorf("router stopped at start: %v", err)
	case <-time.After(60 * time.Second):
		return errors.New("router not running after 60s")
	}
}

// Stop closes the router, then the inbox (draining pending marks).
func (c *Consumer) Stop() error {
	c.stopOnce.Do(func() {
		defer c.stopped.Store(true)
		err := c.router.Close()
		if rerr := <-c.done; rerr != nil {
			err = errors.Join(err, rerr)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err = errors.Join(err, c.Inbox.Close(ctx))
		for _, f := range c.closers {
			err = errors.Join(err, f())
		}
		c.stopErr = err
	})
	return c.stopErr
}

// StartConsumer builds and runs an in-process consumer, stopped when the
// test ends (if not before).
func StartConsumer(t testing.TB, spec ConsumerSpec, shared stores.Store) *Consumer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := NewConsumer(ctx, spec, shared)
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	if err := c.Run(); err != nil {
		t.Fatalf("consumer: %v", err)
	}
	t.Cleanup(func() {
		if c.stopped.Load() {
			return // stopped by the test, which reported the error
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the consumer: %v", err)
		}
	})
	return c
}
