package inboxmetrics_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/metrics"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/driver"
	"github.com/watermill-inbox/inbox/stores/memory"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	sqlitedialect "github.com/watermill-inbox/inbox/stores/sql/sqlite"
)

// TestPrometheus_through_the_middleware: the middleware scopes the metrics
// to its bus and group, counts outcomes and times store calls.
func TestPrometheus_through_the_middleware(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := inboxmetrics.NewPrometheus(inboxmetrics.PrometheusConfig{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	store, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "rabbit", Group: "billing", Alias: keying.StaticAlias("charge"), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	h := ib.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for range 2 {
		msg := message.NewMessage("m-1", nil)
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
		msg.Ack()
	}
	if err := ib.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Every outcome and wait reason the middleware defines (read from its
	// source) is exported from the handler's first report on, at zero
	// unless counted.
	var want strings.Builder
	want.WriteString("# HELP watermill_inbox_messages_total Messages seen by the inbox middleware, by outcome.\n# TYPE watermill_inbox_messages_total counter\n")
	for _, o := range constValues(t, filepath.Join("..", "middleware"), "Outcome") {
		n := map[string]int{"duplicate": 1, "processed": 1}[o]
		if o != string(inboxmw.OutcomeAcquired) { // never counted
			fmt.Fprintf(&want, "watermill_inbox_messages_total{bus=\"rabbit\",group=\"billing\",handler_name=\"\",outcome=%q} %d\n", o, n)
		}
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want.String()), "watermill_inbox_messages_total"); err != nil {
		t.Fatal(err)
	}
	// The second delivery may have waited on the first one's mark: the
	// wait series are there, whatever their values.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() == "watermill_inbox_wait_seconds_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" {
						reasons[l.GetValue()] = true
					}
				}
			}
		}
	}
	for name, r := range constValues(t, filepath.Join("..", "middleware"), "Wait") {
		if !reasons[r] {
			t.Errorf("no watermill_inbox_wait_seconds_total series of reason %q (inboxmw.%s); got %v", r, name, reasons)
		}
	}
	// try_begin twice and complete once, all ok: each call's ok series,
	// and its error series at zero.
	if n := testutil.CollectAndCount(reg, "watermill_inbox_store_call_duration_seconds"); n != 4 {
		t.Fatalf("%d store call series, want 4 (try_begin and complete, ok and error)", n)
	}
}

// A store call's error series is exported at zero from the call's first
// report on, so that the first failure is an increase that rate() sees
// (InboxStoreFailing watches the share of failed calls).
func TestPrometheus_store_call_errors_exported_at_zero(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := inboxmetrics.NewPrometheus(inboxmetrics.PrometheusConfig{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	s := m.Scope("rabbit", "billing")
	s.StoreCall(inboxmw.OpTryBegin, time.Millisecond, nil)
	s.StoreCall(inboxmw.OpExtend, time.Millisecond, errors.New("down"))
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range got {
		for _, m := range mf.GetMetric() {
			var op, result string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "op":
					op = l.GetValue()
				case "result":
					result = l.GetValue()
				}
			}
			counts[op+" "+result] = m.GetHistogram().GetSampleCount()
		}
	}
	wantCounts := map[string]uint64{"extend error": 1, "extend ok": 0, "try_begin error": 0, "try_begin ok": 1}
	if fmt.Sprint(counts) != fmt.Sprint(wantCounts) {
		t.Fatalf("store call series (op result: count) %v, want %v", counts, wantCounts)
	}
}

func TestPrometheus_unscoped_waits_and_errors(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := inboxmetrics.NewPrometheus(inboxmetrics.PrometheusConfig{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	m.Outcome("charge", inboxmw.OutcomeProcessed)
	m.StoreCall(inboxmw.OpTryBegin, time.Second, errors.New("down"))
	m.Waited("charge", inboxmw.WaitStoreBackoff, 1500*time.Millisecond)
	m.Scope("kafka", "g").Waited("charge", inboxmw.WaitBusy, time.Second)
	want := `
# HELP watermill_inbox_wait_seconds_total Time messages waited in-process before their claim was settled: on a busy key, or backing off a failing store.
# TYPE watermill_inbox_wait_seconds_total counter
watermill_inbox_wait_seconds_total{bus="",group="",handler_name="charge",reason="busy"} 0
watermill_inbox_wait_seconds_total{bus="",group="",handler_name="charge",reason="store_backoff"} 1.5
watermill_inbox_wait_seconds_total{bus="kafka",group="g",handler_name="charge",reason="busy"} 1
watermill_inbox_wait_seconds_total{bus="kafka",group="g",handler_name="charge",reason="store_backoff"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "watermill_inbox_wait_seconds_total"); err != nil {
		t.Fatal(err)
	}
	if _, err := inboxmetrics.NewPrometheus(inboxmetrics.PrometheusConfig{Registerer: reg}); err == nil {
		t.Fatal("registering twice on one registry succeeded")
	}
	if _, err := inboxmetrics.NewPrometheus(inboxmetrics.PrometheusConfig{}); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Fatalf("missing registerer: %v", err)
	}
}

func TestRegisterMemoryStore_exports_evictions(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	store, err := memory.New(memory.Options{MaxEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := inboxmetrics.RegisterMemoryStore(reg, "", store, prometheus.Labels{"store": "orders"}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c"} {
		if err := store.MarkProcessed(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP watermill_inbox_memory_evictions_total Records the in-memory inbox store removed before their expiry to stay within MaxEntries.
# TYPE watermill_inbox_memory_evictions_total counter
watermill_inbox_memory_evictions_total{store="orders"} 1
# HELP watermill_inbox_memory_records Records held by the in-memory inbox store, expired ones not yet swept included.
# TYPE watermill_inbox_memory_records gauge
watermill_inbox_memory_records{store="orders"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// TestRegisterStore_memory_store_unbatched: the memory store sends every
// call alone, so under concurrent calls every round trip lands in the first
// bucket, and the histogram's count, sum and the round-trip counter are the
// calls made.
func TestRegisterStore_memory_store_unbatched(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	store, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := inboxmetrics.RegisterStore(reg, "app", store, prometheus.Labels{"store": "orders"}); err != nil {
		t.Fatal(err)
	}
	const keys = 50
	var wg sync.WaitGroup
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("k%d", i)
			c, err := store.TryBegin(context.Background(), key, inbox.BeginOptions{})
			if err == nil {
				err = store.Complete(context.Background(), key, c.LeaseID)
			}
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	want := `
# HELP app_inbox_store_batch_size Store calls carried by each round trip to the backend (group commit).
# TYPE app_inbox_store_batch_size histogram
app_inbox_store_batch_size_bucket{store="orders",le="1"} 100
app_inbox_store_batch_size_bucket{store="orders",le="2"} 100
app_inbox_store_batch_size_bucket{store="orders",le="4"} 100
app_inbox_store_batch_size_bucket{store="orders",le="8"} 100
app_inbox_store_batch_size_bucket{store="orders",le="16"} 100
app_inbox_store_batch_size_bucket{store="orders",le="32"} 100
app_inbox_store_batch_size_bucket{store="orders",le="64"} 100
app_inbox_store_batch_size_bucket{store="orders",le="128"} 100
app_inbox_store_batch_size_bucket{store="orders",le="+Inf"} 100
app_inbox_store_batch_size_sum{store="orders"} 100
app_inbox_store_batch_size_count{store="orders"} 100
# HELP app_inbox_store_round_trips_total Round trips of batched store calls to the backend.
# TYPE app_inbox_store_round_trips_total counter
app_inbox_store_round_trips_total{store="orders"} 100
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// gated is a Driver whose round trips wait until open is closed, so that
// calls made meanwhile queue and travel together in the next round trip.
type gated struct {
	open    chan struct{}
	entered chan struct{} // one value per round trip that began waiting
}

func (g *gated) Apply(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	for i, op := range ops {
		if op.Kind == driver.Claim {
			res[i] = inbox.Claim{Status: inbox.Acquired, LeaseID: op.LeaseID, ExpiresAt: time.Now().Add(op.Lease), Lease: op.Lease}
		}
	}
	return nil
}

func (g *gated) Extend(context.Context, string, string, time.Duration) (time.Time, error) {
	return time.Time{}, inbox.ErrNotSupported
}
func (g *gated) Get(context.Context, string) (inbox.Record, error) { return inbox.Record{}, nil }
func (g *gated) Close() error                                      { return nil }
func (g *gated) List(context.Context, inbox.ListOptions) (inbox.ListPage, error) {
	return inbox.ListPage{}, nil
}
func (g *gated) Forget(context.Context, string) error       { return nil }
func (g *gated) ForceRelease(context.Context, string) error { return nil }

// TestRegisterStore_batching_store: calls made while a round trip is in
// flight share the next one; the exported histogram holds the store's
// round trips in the buckets of their sizes (cumulative), its sum is the
// calls made, and the counter is the round trips.
func TestRegisterStore_batching_store(t *testing.T) {
	t.Parallel()
	g := &gated{entered: make(chan struct{}, 1)}
	store, err := driver.New(g, driver.Config{Name: "gated store", Lease: time.Minute, Batch: driver.Batch{MaxBatch: 16}})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	reg := prometheus.NewRegistry()
	if err := inboxmetrics.RegisterStore(reg, "", store, nil); err != nil {
		t.Fatal(err)
	}
	const callers = 24 // more than MaxBatch: the queue needs two batches
	calls := 0
	deadline := time.Now().Add(30 * time.Second)
	for round := 0; ; round++ {
		g.open = make(chan struct{})
		var started, done sync.WaitGroup
		for i := range callers {
			started.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				started.Done()
				if _, err := store.TryBegin(context.Background(), fmt.Sprintf("r%d-k%d", round, i), inbox.BeginOptions{}); err != nil {
					t.Error(err)
				}
			}()
		}
		started.Wait()
		<-g.entered // the first round trip is in flight; the others queue
		close(g.open)
		done.Wait()
		select { // a later round trip of this round may have knocked too
		case <-g.entered:
		default:
		}
		calls += callers
		if s := store.BatchStats(); s.RoundTrips < s.Calls {
			break // some round trip carried several calls
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d concurrent calls in %d rounds, never two in one round trip", calls, round+1)
		}
	}

	st := store.BatchStats()
	if st.Calls != uint64(calls) {
		t.Fatalf("store counted %d calls, %d made", st.Calls, calls)
	}
	if st.Sizes[0] == st.RoundTrips {
		t.Fatalf("BatchStats %+v: every round trip of one call, though some carried several", st)
	}
	// The histogram, built from the store's counts: cumulative buckets at
	// 1, 2, 4, ..., 128, the calls as its sum, the round trips as its count.
	var want strings.Builder
	want.WriteString("# HELP watermill_inbox_store_batch_size Store calls carried by each round trip to the backend (group commit).\n# TYPE watermill_inbox_store_batch_size histogram\n")
	var cum uint64
	for i, le := range driver.BatchSizeBounds {
		cum += st.Sizes[i]
		fmt.Fprintf(&want, "watermill_inbox_store_batch_size_bucket{le=\"%d\"} %d\n", le, cum)
	}
	fmt.Fprintf(&want, "watermill_inbox_store_batch_size_bucket{le=\"+Inf\"} %d\n", st.RoundTrips)
	fmt.Fprintf(&want, "watermill_inbox_store_batch_size_sum %d\nwatermill_inbox_store_batch_size_count %d\n", calls, st.RoundTrips)
	want.WriteString("# HELP watermill_inbox_store_round_trips_total Round trips of batched store calls to the backend.\n# TYPE watermill_inbox_store_round_trips_total counter\n")
	fmt.Fprintf(&want, "watermill_inbox_store_round_trips_total %d\n", st.RoundTrips)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want.String())); err != nil {
		t.Fatal(err)
	}
}

func TestRegisterStore_rejects_bad_arguments(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	store, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := inboxmetrics.RegisterStore(nil, "", store, nil); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Errorf("nil registerer: %v", err)
	}
	if err := inboxmetrics.RegisterStore(reg, "", nil, nil); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Errorf("nil store: %v", err)
	}
	if err := inboxmetrics.RegisterStore(reg, "", store, prometheus.Labels{"store": "a"}); err != nil {
		t.Fatal(err)
	}
	if err := inboxmetrics.RegisterStore(reg, "", store, prometheus.Labels{"store": "b"}); err != nil {
		t.Errorf("a second store with other labels: %v", err)
	}
	if err := inboxmetrics.RegisterStore(reg, "", store, prometheus.Labels{"store": "a"}); err == nil {
		t.Error("the same labels twice on one registry succeeded")
	}
}

// TestRegisterCleanup_exports_deleted_and_backlog: a SQL store's deleted
// rows are counted; its backlog is exported once its janitor has counted
// it, and not for a store whose janitor is off.
func TestRegisterCleanup_exports_deleted_and_backlog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if err := inboxmetrics.RegisterCleanup(prometheus.NewRegistry(), "", nil, nil); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Fatalf("RegisterCleanup of a nil store: %v, want ErrInvalidArgument", err)
	}
	open := func(opts sqlstore.Options) *sqlstore.Store {
		db, err := sql.Open("sqlite", sqlitedialect.DSN(filepath.Join(t.TempDir(), "inbox.db"), 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { _ = db.Close() })
		opts.Dialect, opts.AutoMigrate, opts.Retention = sqlstore.SQLite, true, time.Millisecond
		s, err := sqlstore.New(ctx, db, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		for _, k := range []string{"a", "b", "c"} {
			if err := s.MarkProcessed(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	reg := prometheus.NewRegistry()
	off := open(sqlstore.Options{DisableCleanup: true})
	on := open(sqlstore.Options{CleanupInterval: 10 * time.Millisecond})
	if err := inboxmetrics.RegisterCleanup(reg, "", off, prometheus.Labels{"store": "off"}); err != nil {
		t.Fatal(err)
	}
	if err := inboxmetrics.RegisterCleanup(reg, "", on, prometheus.Labels{"store": "on"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the janitor deleting the three expired rows", func() bool {
		st := on.CleanupStats()
		return st.Deleted == 3 && !st.Counted.IsZero()
	})
	testenv.Eventually(t, 30*time.Second, "the three rows to expire", func() bool {
		n, err := off.Backlog(ctx)
		return err == nil && n == 3
	})
	if n, err := off.Cleanup(ctx); err != nil || n != 3 {
		t.Fatalf("Cleanup = %d, %v; want 3", n, err)
	}
	want := `
# HELP watermill_inbox_store_cleanup_backlog Expired rows not deleted yet, counted at the end of the janitor's latest pass.
# TYPE watermill_inbox_store_cleanup_backlog gauge
watermill_inbox_store_cleanup_backlog{store="on"} 0
# HELP watermill_inbox_store_cleanup_deleted_total Expired rows the store's cleanup deleted.
# TYPE watermill_inbox_store_cleanup_deleted_total counter
watermill_inbox_store_cleanup_deleted_total{store="off"} 3
watermill_inbox_store_cleanup_deleted_total{store="on"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
