// Package harness is the machinery of the end-to-end suite: brokers
// (RabbitMQ, Kafka), stores opened by URL, consumers (in-process routers or
// child processes killed at a crash point), a ledger that counts every
// application of a handler's effect, the scenarios every cell of the broker ×
// store matrix runs, and inboxctl (the operators' command line, built from
// the root module) for the scenarios that operate the store.
//
// The suite's test packages (module e2e, and e2e/mongo, whose FerretDB needs
// other versions of modernc.org/sqlite than the SQL store) describe their
// stores as [StoreKind]s and call [Run] with each scenario.
package harness

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/stores"
)

// StoreKind is a row of the matrix: a store, or the SQL transactional mode
// on a database.
type StoreKind struct {
	// Name names the subtests ("redis", "postgres-tx").
	Name string
	// New prepares a fresh store for one test case (a new key prefix, table
	// or collection, or a new server), removed when the test ends. Its
	// Spec.URL reaches the store directly; the outage scenario puts a fault
	// proxy in front of the URL's host itself (kinds whose NoOutage is
	// empty).
	New func(t *testing.T) StoreCase

	// Why a scenario cannot run on this store; empty when it can.
	// NoCrossProcess: the crash scenario needs the store reachable from
	// another process. NoOutage: the outage scenario cuts a network link.
	// NoConcurrency: the competing-consumers scenario needs atomic claims.
	NoCrossProcess, NoOutage, NoConcurrency string

	// Tx marks the SQL transactional mode, where the effect commits with
	// the mark: a crash after the effect leaves neither.
	Tx bool
}

// StoreCase is one test case's store.
type StoreCase struct {
	// Spec is what consumers use (their URL goes through Proxy when the
	// case is proxied).
	Spec StoreSpec
	// Shared, when set, is the store instance every in-process consumer
	// uses (the memory store cannot be reached otherwise).
	Shared stores.Store
	// Proxy is the fault proxy between consumers and the store, when
	// proxied (set by the harness).
	Proxy *faultproxy.Proxy
	// Inspect reads records directly (never through Proxy).
	Inspect inbox.LeaseStore
	// Ledger counts the effects when the mode keeps them itself (the
	// transactional mode's table); nil: a file ledger.
	Ledger Ledger
}

// Run runs scenario for every broker × store, each cell a parallel subtest
// named broker/store.
func Run(t *testing.T, kinds []StoreKind, scenario func(t *testing.T, b BrokerKind, s StoreKind)) {
	t.Parallel()
	for _, b := range Brokers() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			for _, s := range kinds {
				t.Run(s.Name, func(t *testing.T) {
					t.Parallel()
					scenario(t, b, s)
				})
			}
		})
	}
}

// skip skips a cell the store cannot run, saying why, and records it for the
// summary of `make test`.
func skip(t *testing.T, store, scenario, why string) {
	t.Helper()
	testenv.RecordSkip("e2e "+scenario+" on "+store, why)
	t.Skipf("%s cannot run on %s: %s", scenario, store, why)
}

// env is one case: a broker destination, a store, a ledger and the spec of
// its consumers.
type env struct {
	b      BrokerSpec
	store  StoreCase
	ledger Ledger
	spec   ConsumerSpec
	pub    message.Publisher

	partitions int
}

// msg is NewMessage(id, the i-th partition of the case's topic).
func (e *env) msg(id string, i int) *message.Message { return NewMessage(id, i%e.partitions) }

// newEnv prepares a case. Its Kafka topic has the given number of
// partitions, or one for a store without atomic claims: one consumer then
// handles its messages one at a time (RabbitMQ consumers do anyway, with a
// prefetch of one).
// Each of brokerOpts changes the broker's spec before the destination is
// created.
func newEnv(t *testing.T, bk BrokerKind, sk StoreKind, proxied bool, partitions int, brokerOpts ...func(*BrokerSpec)) *env {
	t.Helper()
	if sk.NoConcurrency != "" {
		partitions = 1
	}
	b := bk.Start(t)
	for _, o := range brokerOpts {
		o(&b)
	}
	sc := sk.New(t)
	if proxied {
		u, err := url.Parse(sc.Spec.URL)
		if err != nil {
			t.Fatalf("store URL: %v", err)
		}
		sc.Proxy = faultproxy.New(t, u.Host)
		u.Host = sc.Proxy.Addr()
		sc.Spec.URL = u.String()
	}
	e := &env{b: b, store: sc, ledger: sc.Ledger, partitions: partitions}
	ledgerPath := ""
	if e.ledger == nil {
		fl := NewFileLedger(t)
		e.ledger, ledgerPath = fl, fl.Path
	}
	e.spec = ConsumerSpec{
		Broker:  b,
		Dest:    b.CreateDest(t, partitions),
		Group:   "g-" + watermill.NewShortUUID()[:10],
		Handler: "apply",
		Store:   sc.Spec,
		Ledger:  ledgerPath,
		Lease:   5 * time.Second,
	}
	pub, err := b.Publisher()
	if err != nil {
		t.Fatalf("publisher: %v", err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	e.pub = pub
	return e
}

// IDs returns n ids "prefix-000", "prefix-001", ...
func IDs(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// NewMessage is a message whose payload (the ledger's id) and IdempotencyKey
// are id, with a new Watermill UUID (a producer retry), for Kafka partition
// partition.
func NewMessage(id string, partition int) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(id))
	msg.Metadata.Set(keying.DefaultIDMetadataKey, id)
	msg.Metadata.Set(partitionKey, strconv.Itoa(partition))
	return msg
}

func (e *env) publish(t *testing.T, msgs ...*message.Message) {
	t.Helper()
	for _, m := range msgs {
		if err := e.pub.Publish(e.spec.Dest, m); err != nil {
			t.Fatalf("publishing to %s: %v", e.spec.Dest, err)
		}
	}
}

// missing returns the ids the ledger has not seen.
func (e *env) missing(t *testing.T, ids []string) []string {
	counts := e.ledger.Counts(t)
	var out []string
	for _, id := range ids {
		if counts[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

// waitFor polls cond every 20 ms until it holds, failing the test after
// timeout with what and the state diag describes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool, diag func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not done within %s: %s; %s", timeout, what, diag())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// expectCounts checks the ledger against want (id -> applications); ids
// outside want must not appear.
func (e *env) expectCounts(t *testing.T, want map[string]int) {
	t.Helper()
	got := e.ledger.Counts(t)
	var bad []string
	for id, n := range want {
		if got[id] != n {
			bad = append(bad, fmt.Sprintf("%s applied %d times, want %d", id, got[id], n))
		}
	}
	for id, n := range got {
		if _, ok := want[id]; !ok {
			bad = append(bad, fmt.Sprintf("unexpected %s applied %d times", abbrev(id), n))
		}
	}
	slices.Sort(bad)
	if len(bad) > 0 {
		t.Errorf("ledger (%d ids) differs:\n  %s", len(got), strings.Join(bad, "\n  "))
	}
}

func once(ids ...[]string) map[string]int {
	m := map[string]int{}
	for _, l := range ids {
		for _, id := range l {
			m[id] = 1
		}
	}
	return m
}

// expectProcessed checks, when the store can be read, that every key is
// marked processed.
func (e *env) expectProcessed(t *testing.T, ids []string) {
	t.Helper()
	if e.store.Inspect == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range ids {
		key := e.spec.Key(id)
		rec, err := e.store.Inspect.Get(ctx, key)
		if err != nil {
			t.Errorf("Get(%s): %v", abbrev(key), err)
			continue
		}
		if rec.State != inbox.StateProcessed {
			t.Errorf("Get(%s) = %v, want processed", abbrev(key), rec.State)
		}
	}
}

// processed reports whether every id's key is marked processed (true when
// the store cannot be read: the transactional mode's ledger is its check).
func (e *env) processed(t *testing.T, ids []string) bool {
	t.Helper()
	if e.store.Inspect == nil {
		return true
	}
	for _, id := range ids {
		if e.record(t, id).State != inbox.StateProcessed {
			return false
		}
	}
	return true
}

func (e *env) record(t *testing.T, id string) inbox.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec, err := e.store.Inspect.Get(ctx, e.spec.Key(id))
	if err != nil {
		t.Fatalf("Get(%s): %v", e.spec.Key(id), err)
	}
	return rec
}

func abbrev(s string) string {
	if len(s) > 60 {
		return fmt.Sprintf("%s...(%d bytes)", s[:40], len(s))
	}
	return s
}

// stopAll stops the consumers at once (one after the other, each Kafka
// consumer leaving would start a rebalance that the next one waits out).
func stopAll(t *testing.T, cs ...*Consumer) {
	t.Helper()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.Stop()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("stopping consumer %d: %v", i, err)
		}
	}
}

func describe(cs ...*Consumer) string {
	var b strings.Builder
	for i, c := range cs {
		fmt.Fprintf(&b, "consumer %d: acked %d, nacked %d (store %d, injected %d)", i, c.Probe.Acked(), c.Probe.Failed(), c.Probe.StoreFailed(), c.Probe.Injected())
		if c.Inbox.Outcomes != nil {
			fmt.Fprintf(&b, ", outcomes %s", c.Inbox.Outcomes)
		}
		b.WriteString("; ")
	}
	return b.String()
}
