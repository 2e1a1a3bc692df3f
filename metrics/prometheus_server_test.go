package inboxmetrics_test

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/metrics"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
	"github.com/watermill-inbox/inbox/stores/remote"
	"github.com/watermill-inbox/inbox/stores/remote/server"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	sqlitedialect "github.com/watermill-inbox/inbox/stores/sql/sqlite"
)

const (
	tBus, tGroup = "shop", "orders"
	inboxdToken  = "inboxd-test-token"
	// waitFor bounds each wait of the test: generous, for a machine under
	// load (-race, a CPU hog); the waits end as soon as their condition
	// holds.
	waitFor = 40 * time.Second
)

// TestPrometheus_dashboard_and_alerts runs dashboard.json and alerts.yml
// against a real Prometheus (the server of the Debian package prometheus,
// started on a spare port): an application (the middleware with its
// Prometheus metrics over a Watermill router) and inboxd's server make every
// outcome the alert rules watch happen, Prometheus scrapes both every
// 2 seconds, and every query of the dashboard and every alert expression must
// return series that carry the labels they name (by clauses, legends,
// matchers, annotations), and every alert must fire. A subtest then renames
// each metric and label name of each query in a copy, and each renamed
// query must fail the same check.
func TestPrometheus_dashboard_and_alerts(t *testing.T) {
	t.Parallel()
	bin := testenv.Program(t, "prometheus", howToPrometheus)
	ctx := context.Background()

	// The application's metrics, and a store whose calls the test can cut.
	reg := prometheus.NewRegistry()
	m, err := inboxmetrics.NewPrometheus(inboxmetrics.PrometheusConfig{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memory.New(memory.Options{Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	st := &faultyStore{LeaseStore: mem, retention: mem}
	small, err := memory.New(memory.Options{MaxEntries: 1}) // evicts
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = small.Close() })
	if err := inboxmetrics.RegisterMemoryStore(reg, "", small, prometheus.Labels{"store": "sessions"}); err != nil {
		t.Fatal(err)
	}
	// A store whose server evicts keys and has little memory left: a
	// stand-in for the Redis store's ServerMemory (stores/redis tests the
	// real one against a server that evicts).
	srvMem := &serverMemory{used: 95 << 20, limit: 100 << 20}
	if err := inboxmetrics.RegisterServerMemory(reg, "", srvMem, prometheus.Labels{"store": "orders-redis"}); err != nil {
		t.Fatal(err)
	}
	app := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(app.Close)

	// inboxd's server over the same store, and a client of it.
	srv, err := server.New(server.Config{Store: st, Token: inboxdToken, MetricsOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	inboxd := httptest.NewServer(srv)
	t.Cleanup(inboxd.Close)
	rc, err := remote.New(remote.Options{URL: inboxd.URL, Token: inboxdToken, Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rc.Close() })

	// Prometheus, with the rules of alerts.yml, their for: durations made 0s
	// so that an alert fires at the first evaluation that finds it true.
	rules, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	rules = regexp.MustCompile(`(?m)^(\s+)for: \S+$`).ReplaceAll(rules, []byte("${1}for: 0s"))
	p := startPrometheus(t, bin, rules, map[string]string{"app": app.Listener.Addr().String(), "inboxd": inboxd.Listener.Addr().String()})

	// The application: four handlers over a GoChannel, through three inboxes.
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	newInbox := func(cfg inboxmw.Config) *inboxmw.Inbox {
		cfg.Store, cfg.Bus, cfg.Group, cfg.Metrics = st, tBus, cmp.Or(cfg.Group, tGroup), m
		cfg.Lease, cfg.MaxBusyWait = 2*time.Second, cmp.Or(cfg.MaxBusyWait, time.Second)
		ib, err := inboxmw.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_ = ib.Close(ctx)
		})
		return ib
	}
	// charge: dead at the first failure, payloads fingerprinted, stale
	// messages by their sent_at metadata.
	charge := newInbox(inboxmw.Config{
		MaxAttempts: 1, PayloadHash: inboxmw.PayloadHashWarn, Backoff: inboxmw.ExponentialBackoff(0, 0),
		Timestamp: func(msg *message.Message) (time.Time, bool) {
			ts, err := time.Parse(time.RFC3339Nano, msg.Metadata.Get("sent_at"))
			return ts, err == nil
		},
	})
	// reserve: waits on a busy key for 3 s before it nacks. The busy
	// waits counted are the pauses between polls of the key, which a
	// starved CPU stretches (a late wake-up is not counted): a wait much
	// longer than the polls' pauses (up to 1 s) keeps the counted share of
	// it far above InboxBusyWaits' threshold on a busy machine too.
	reserve := newInbox(inboxmw.Config{MaxBusyWait: 3 * time.Second})
	// notify: fails open, in a group of its own, whose store calls during
	// the cut are mostly failures (InboxStoreFailing watches the share of
	// failed store calls of each bus and group).
	open := newInbox(inboxmw.Config{FailOpen: true, Group: "notices"})
	// ship: failed attempts are handed to the broker, which holds the
	// backoff; copies of messages whose id starts with handoff-fails are
	// refused.
	ship := newInbox(inboxmw.Config{Redelivery: &testBroker{pub: ps}, Backoff: func(int) time.Duration { return 300 * time.Millisecond }})
	poison, err := wmw.PoisonQueueWithFilter(ps, "poison", func(err error) bool { return !inboxmw.IsTransient(err) })
	if err != nil {
		t.Fatal(err)
	}

	var (
		ran         sync.Map // message UUID -> struct{}: the handler succeeded on it
		failedOnce  sync.Map // message UUID -> struct{}: its first attempt failed
		hangs       sync.Map // message UUID -> struct{}: its first attempt hung
		hangStarted = make(chan struct{})
	)
	handle := func(msg *message.Message) error {
		switch msg.Metadata.Get("do") {
		case "fail":
			return errors.New("the test's handler fails")
		case "fail-once":
			if _, again := failedOnce.LoadOrStore(msg.UUID, struct{}{}); !again {
				return errors.New("the test's handler fails the first attempt")
			}
		case "hang":
			if _, again := hangs.LoadOrStore(msg.UUID, struct{}{}); !again {
				close(hangStarted)
				<-msg.Context().Done() // until the lease is lost
				return context.Cause(msg.Context())
			}
		}
		ran.Store(msg.UUID, struct{}{})
		return nil
	}
	for _, h := range []struct {
		name string
		ib   *inboxmw.Inbox
	}{{"charge", charge}, {"reserve", reserve}, {"notify", open}, {"ship", ship}} {
		hd := router.AddConsumerHandler(h.name, h.name, ps, handle)
		if h.ib == charge {
			hd.AddMiddleware(poison)
		}
		hd.AddMiddleware(h.ib.Middleware)
	}
	go func() { _ = router.Run(ctx) }()
	t.Cleanup(func() {
		_ = router.Close()
		_ = ps.Close()
	})
	<-router.Running()

	publish := func(handler, id, payload string, meta ...string) {
		t.Helper()
		msg := message.NewMessage(id, []byte(payload))
		for i := 0; i+1 < len(meta); i += 2 {
			msg.Metadata.Set(meta[i], meta[i+1])
		}
		if err := ps.Publish(handler, msg); err != nil {
			t.Fatal(err)
		}
	}
	outcome := func(handler string, o inboxmw.Outcome) float64 {
		return gathered(t, reg, "watermill_inbox_messages_total", map[string]string{"handler_name": handler, "outcome": string(o)})
	}
	waitOutcome := func(handler string, o inboxmw.Outcome, n float64) {
		t.Helper()
		testenv.Eventually(t, waitFor, fmt.Sprintf("%v outcomes %s of handler %s", n, o, handler), func() bool { return outcome(handler, o) >= n })
	}
	waitRan := func(id string) {
		t.Helper()
		testenv.Eventually(t, waitFor, "the handler succeeding on "+id, func() bool { _, ok := ran.Load(id); return ok })
	}
	key := func(handler, id string) string {
		return keying.Key{Bus: tBus, Group: tGroup, Alias: handler, ID: id}.String()
	}
	storeCalls := func(group, result string) float64 {
		return gathered(t, reg, "watermill_inbox_store_call_duration_seconds", map[string]string{"group": group, "result": result})
	}

	// Each handler's first message exports its series at zero; Prometheus
	// scrapes them before anything else happens, so that what follows is an
	// increase it sees. inboxd, too, answers once first, and the memory
	// store's evictions are scraped at zero.
	for _, h := range []string{"charge", "reserve", "notify", "ship"} {
		publish(h, "warm-"+h, "x")
	}
	for _, h := range []string{"charge", "reserve", "notify", "ship"} {
		waitOutcome(h, inboxmw.OutcomeProcessed, 1)
	}
	if c, err := rc.TryBegin(ctx, key("inboxd", "warm"), inbox.BeginOptions{}); err != nil {
		t.Fatal(err)
	} else if err := rc.Complete(ctx, key("inboxd", "warm"), c.LeaseID); err != nil {
		t.Fatal(err)
	}
	p.waitSeries(t, `count by (handler_name) (last_over_time(watermill_inbox_messages_total{outcome="dead"}[5m]))`, 4)
	p.waitSeries(t, `last_over_time(watermill_inbox_memory_evictions_total[5m]) == 0`, 1)
	p.waitSeries(t, `last_over_time(watermill_inbox_store_evicted_keys_total[5m]) == 0`, 1)
	p.waitSeries(t, `last_over_time(inbox_server_requests_total{endpoint="try-begin", status="Acquired"}[5m])`, 1)

	// A dead key, a lost lease, a mark that fails, a stale message, a
	// duplicate with another payload, a key busy for the whole wait, hand-offs
	// to the broker that succeed and fail: all at once.
	publish("charge", "dead-1", "x", "do", "fail")
	publish("charge", "lease-1", "x", "do", "hang")
	st.noMark.Store(key("charge", "nomark-1"), struct{}{})
	publish("charge", "nomark-1", "x")
	publish("charge", "stale-1", "x", "sent_at", time.Now().Add(-2*time.Hour).Format(time.RFC3339Nano))
	publish("charge", "pm-1", "first payload")
	held, err := mem.TryBegin(ctx, key("reserve", "busy-1"), inbox.BeginOptions{Lease: time.Minute})
	if err != nil || held.Status != inbox.Acquired {
		t.Fatalf("holding the key of busy-1: %+v, %v", held, err)
	}
	publish("reserve", "busy-1", "x")
	publish("ship", "handoff-ok-1", "x", "do", "fail-once")
	publish("ship", "handoff-fails-1", "x", "do", "fail-once")

	waitOutcome("charge", inboxmw.OutcomeDead, 1)
	<-hangStarted
	if err := mem.ForceRelease(ctx, key("charge", "lease-1")); err != nil { // the heartbeat finds the lease lost
		t.Fatal(err)
	}
	waitOutcome("charge", inboxmw.OutcomeLeaseLost, 1)
	waitRan("lease-1") // its redelivery
	waitOutcome("charge", inboxmw.OutcomeCompleteFailed, 1)
	waitOutcome("charge", inboxmw.OutcomeStale, 1)
	testenv.Eventually(t, waitFor, "pm-1 marked processed", func() bool {
		r, err := mem.Get(ctx, key("charge", "pm-1"))
		return err == nil && r.State == inbox.StateProcessed
	})
	publish("charge", "pm-1", "second payload")
	waitOutcome("charge", inboxmw.OutcomePayloadMismatch, 1)
	waitOutcome("charge", inboxmw.OutcomeDuplicate, 1)
	waitOutcome("reserve", inboxmw.OutcomeBusy, 1) // 3 s of waits, then nacked and delivered again
	if err := mem.Release(ctx, key("reserve", "busy-1"), held.LeaseID); err != nil {
		t.Fatal(err)
	}
	waitRan("busy-1")
	waitOutcome("ship", inboxmw.OutcomeRedelivered, 1)
	waitOutcome("ship", inboxmw.OutcomeRedeliveryFailed, 1)
	waitRan("handoff-ok-1")
	waitRan("handoff-fails-1")

	// The store cut: the fail-closed inbox retries and nacks, the fail-open
	// one runs its handler without deduplication (one message after
	// another until three of its claims have reached the store and failed:
	// claims are paced during an outage, and one that finds no slot is not
	// sent), inboxd answers 503 (three times after Prometheus has seen the
	// first: the alert wants three failures it sees).
	st.cut.Store(true)
	publish("charge", "cut-1", "x")
	for i := 1; storeCalls("notices", "error") < 3; i++ {
		publish("notify", fmt.Sprintf("open-%d", i), "x")
		waitOutcome("notify", inboxmw.OutcomeFailOpen, float64(i))
	}
	waitOutcome("charge", inboxmw.OutcomeStoreError, 1)
	p.repeated(t, `inbox_server_requests_total{status="store_unavailable"}`, 3, func() {
		if _, err := rc.TryBegin(ctx, key("inboxd", "cut"), inbox.BeginOptions{}); !errors.Is(err, inbox.ErrStoreUnavailable) {
			t.Fatalf("TryBegin through inboxd during the cut: %v, want ErrStoreUnavailable", err)
		}
	})
	st.cut.Store(false)
	waitRan("cut-1")

	// Evictions, and clients refused for their token.
	for _, k := range []string{"s-1", "s-2"} {
		if err := small.MarkProcessed(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	srvMem.evicted.Store(3)
	p.repeated(t, `inbox_server_requests_total{status="unauthorized"}`, 1, func() {
		resp, err := http.Get(inboxd.URL + "/v1/inbox/" + url.PathEscape(key("inboxd", "x")))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("GET without a token: %s, want 401", resp.Status)
		}
	})

	// A SQL store whose janitor cannot delete: it counts the expired rows
	// it leaves at the end of each failed pass.
	behind := cleanupBehindStore(t, 12_000)
	if err := inboxmetrics.RegisterCleanup(reg, "", behind, prometheus.Labels{"store": "orders"}); err != nil {
		t.Fatal(err)
	}
	p.waitSeries(t, `watermill_inbox_store_cleanup_backlog == 12000`, 1)

	// Every query of the dashboard, and every variable.
	queries, variables := dashboardQueries(t)
	if len(queries) < 10 || len(variables) < 3 {
		t.Fatalf("dashboard.json: %d queries and %d variables found, want at least 10 and 3: is the parser still finding them?", len(queries), len(variables))
	}
	for _, q := range queries {
		if err := p.check(q.expr, q.legend); err != nil {
			t.Errorf("dashboard panel %q: %v", q.where, err)
		}
	}
	for _, v := range variables {
		if err := p.checkVariable(v.selector, v.label); err != nil {
			t.Errorf("dashboard variable %q: %v", v.where, err)
		}
	}

	// Every alert rule: its expression, then the alert firing, with the
	// labels its annotations name.
	loaded := p.alertRules(t)
	if want := bytes.Count(rules, []byte("- alert: ")); len(loaded) != want {
		t.Fatalf("Prometheus loaded %d alert rules, alerts.yml has %d", len(loaded), want)
	}
	for _, r := range loaded {
		if err := p.check(r.Query, ""); err != nil {
			t.Errorf("alert %s: %v", r.Name, err)
		}
	}
	var firing map[string][]promAlert
	deadline := time.Now().Add(waitFor)
	for {
		firing = p.firing(t)
		var missing []string
		for _, r := range loaded {
			if len(firing[r.Name]) == 0 {
				missing = append(missing, r.Name)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alerts not firing after %s: %v (firing: %v)", waitFor, missing, firing)
		}
		time.Sleep(100 * time.Millisecond) // polling interval
	}
	for _, r := range loaded {
		for _, a := range firing[r.Name] {
			if err := annotationLabels(r.Annotations, a.Labels); err != nil {
				t.Errorf("alert %s: %v", r.Name, err)
			}
		}
	}
	if t.Failed() {
		return
	}

	// The checks fail when a metric or label name changes: each name of
	// each query, alert expression, legend and variable, renamed in a copy,
	// makes its check fail.
	t.Run("a_renamed_metric_or_label_fails", func(t *testing.T) {
		mutations := 0
		for _, q := range queries {
			for _, name := range names(q.expr) {
				mutations++
				if err := p.check(rename(q.expr, name), q.legend); err == nil {
					t.Errorf("dashboard panel %q with %s renamed passes the check:\n%s", q.where, name, rename(q.expr, name))
				}
			}
			for _, name := range legendLabels(q.legend) {
				mutations++
				if err := p.check(q.expr, rename(q.legend, name)); err == nil {
					t.Errorf("dashboard panel %q with %s renamed in its legend passes the check", q.where, name)
				}
			}
		}
		for _, v := range variables {
			for _, name := range append(names(v.selector), v.label) {
				mutations++
				if err := p.checkVariable(rename(v.selector, name), strings.ReplaceAll(v.label, name, name+"_renamed")); err == nil {
					t.Errorf("dashboard variable %q with %s renamed passes the check", v.where, name)
				}
			}
		}
		for _, r := range loaded {
			for _, name := range names(r.Query) {
				mutations++
				if err := p.check(rename(r.Query, name), ""); err == nil {
					t.Errorf("alert %s with %s renamed passes the check:\n%s", r.Name, name, rename(r.Query, name))
				}
			}
			a := firing[r.Name][0]
			for _, name := range annotationRefs(r.Annotations) {
				mutations++
				renamed := map[string]string{}
				for k, v := range r.Annotations {
					renamed[k] = rename(v, name)
				}
				if err := annotationLabels(renamed, a.Labels); err == nil {
					t.Errorf("alert %s with $labels.%s renamed in its annotations passes the check", r.Name, name)
				}
			}
		}
		t.Logf("%d renamed metric and label names, each caught", mutations)
		if mutations < 100 {
			t.Errorf("only %d names renamed: is the parser still finding them?", mutations)
		}
	})
}

// cleanupBehindStore returns a SQL store (SQLite, in a temporary file)
// holding n expired rows, whose janitor runs every 100 ms and fails: a
// trigger refuses every DELETE.
func cleanupBehindStore(t *testing.T, n int) *sqlstore.Store {
	t.Helper()
	ctx := context.Background()
	db, err := sql.Open("sqlite", sqlitedialect.DSN(filepath.Join(t.TempDir(), "inbox.db"), 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.SQLite, AutoMigrate: true, Retention: time.Millisecond, CleanupInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := db.ExecContext(ctx, `CREATE TRIGGER inbox_no_delete BEFORE DELETE ON `+sqlstore.DefaultTable+` BEGIN SELECT RAISE(ABORT, 'the test forbids deletes'); END`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				if err := s.MarkProcessed(ctx, fmt.Sprintf("shop:orders:expired:%06d", i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return s
}

// faultyStore is a LeaseStore whose calls all fail while cut, and whose
// Complete fails for the keys in noMark.
type faultyStore struct {
	inbox.LeaseStore
	retention inbox.RetentionReporter
	cut       atomic.Bool
	noMark    sync.Map // key -> struct{}
}

var errCut = fmt.Errorf("%w: the test cut the store", inbox.ErrStoreUnavailable)

func (s *faultyStore) fails() error {
	if s.cut.Load() {
		return errCut
	}
	return nil
}

func (s *faultyStore) Retention() time.Duration { return s.retention.Retention() }

func (s *faultyStore) TryBegin(ctx context.Context, key string, opts inbox.BeginOptions) (inbox.Claim, error) {
	if err := s.fails(); err != nil {
		return inbox.Claim{}, err
	}
	return s.LeaseStore.TryBegin(ctx, key, opts)
}

func (s *faultyStore) Complete(ctx context.Context, key, leaseID string) error {
	if _, no := s.noMark.Load(key); no {
		return errCut
	}
	if err := s.fails(); err != nil {
		return err
	}
	return s.LeaseStore.Complete(ctx, key, leaseID)
}

func (s *faultyStore) Release(ctx context.Context, key, leaseID string) error {
	if err := s.fails(); err != nil {
		return err
	}
	return s.LeaseStore.Release(ctx, key, leaseID)
}

func (s *faultyStore) Fail(ctx context.Context, key, leaseID string, opts inbox.FailOptions) error {
	if err := s.fails(); err != nil {
		return err
	}
	return s.LeaseStore.Fail(ctx, key, leaseID, opts)
}

func (s *faultyStore) Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	if err := s.fails(); err != nil {
		return time.Time{}, err
	}
	return s.LeaseStore.Extend(ctx, key, leaseID, lease)
}

func (s *faultyStore) Get(ctx context.Context, key string) (inbox.Record, error) {
	if err := s.fails(); err != nil {
		return inbox.Record{}, err
	}
	return s.LeaseStore.Get(ctx, key)
}

func (s *faultyStore) IsProcessed(ctx context.Context, key string) (bool, error) {
	if err := s.fails(); err != nil {
		return false, err
	}
	return s.LeaseStore.IsProcessed(ctx, key)
}

func (s *faultyStore) MarkProcessed(ctx context.Context, key string) error {
	if err := s.fails(); err != nil {
		return err
	}
	return s.LeaseStore.MarkProcessed(ctx, key)
}

// testBroker is a Redeliverer that publishes the copy once its delay has
// passed, and refuses the copies of messages whose id starts with
// handoff-fails.
type testBroker struct{ pub message.Publisher }

func (b *testBroker) Redeliver(_ context.Context, topic string, msg *message.Message, delay time.Duration) error {
	if strings.HasPrefix(msg.UUID, "handoff-fails") {
		return errors.New("the test's broker refuses the copy")
	}
	time.AfterFunc(delay, func() { _ = b.pub.Publish(topic, msg) }) // fails harmlessly once the test closed the pub/sub
	return nil
}

// gathered returns the sum of the series of the counter name in reg whose
// labels include labels (of a histogram, the sum of their counts).
func gathered(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			if h := m.GetHistogram(); h != nil {
				sum += float64(h.GetSampleCount())
			} else {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// ---- The dashboard's queries -----------------------------------------------

type dashQuery struct{ where, expr, legend string }

type dashVariable struct{ where, selector, label string }

// grafanaVars are the values the test gives the dashboard's variables:
// every bus, group and handler (the variables' "All"), and a rate interval
// that covers the whole test.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$bus", ".*", "$group", ".*", "$handler", ".*")

// dashboardQueries returns the queries of dashboard.json's panels, and its
// label_values variables, with the variables replaced.
func dashboardQueries(t *testing.T) ([]dashQuery, []dashVariable) {
	t.Helper()
	raw, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr         string `json:"expr"`
			LegendFormat string `json:"legendFormat"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	var queries []dashQuery
	var walk func([]json.RawMessage)
	walk = func(panels []json.RawMessage) {
		for _, r := range panels {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatal(err)
			}
			for _, tg := range p.Targets {
				queries = append(queries, dashQuery{where: p.Title, expr: substitute(t, tg.Expr), legend: tg.LegendFormat})
			}
			walk(p.Panels) // a collapsed row's
		}
	}
	walk(d.Panels)
	var variables []dashVariable
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		sm := labelValues.FindStringSubmatch(q)
		if sm == nil {
			t.Fatalf("dashboard variable %s: query %v is not label_values(selector, label)", v.Name, v.Query)
		}
		variables = append(variables, dashVariable{where: v.Name, selector: substitute(t, sm[1]), label: sm[2]})
	}
	return queries, variables
}

func substitute(t *testing.T, expr string) string {
	t.Helper()
	s := grafanaVars.Replace(expr)
	if strings.Contains(s, "$") {
		t.Fatalf("query %q names a Grafana variable the test does not know", expr)
	}
	return s
}

// ---- The checks --------------------------------------------------------------

var (
	selectorRE = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{([^}]*)\})?\s*\[`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"`)
	byRE       = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	legendRE   = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	refRE      = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
)

type selector struct {
	metric string
	labels []string // named by its matchers
}

// selectors returns the range selectors of expr (every selector of the
// dashboard's and the rules' queries is a range: rate, increase).
func selectors(expr string) []selector {
	var out []selector
	for _, sm := range selectorRE.FindAllStringSubmatch(expr, -1) {
		s := selector{metric: sm[1]}
		for _, mm := range matcherRE.FindAllStringSubmatch(sm[2], -1) {
			s.labels = append(s.labels, mm[1])
		}
		out = append(out, s)
	}
	return out
}

// grouping returns the labels of expr's by clauses.
func grouping(expr string) []string {
	var out []string
	for _, sm := range byRE.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(sm[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	return out
}

func legendLabels(legend string) []string {
	var out []string
	for _, sm := range legendRE.FindAllStringSubmatch(legend, -1) {
		out = append(out, sm[1])
	}
	return out
}

// names returns the metric and label names expr mentions, once each.
func names(expr string) []string {
	var out []string
	for _, s := range selectors(expr) {
		out = append(out, s.metric)
		out = append(out, s.labels...)
	}
	out = append(out, grouping(expr)...)
	slices.Sort(out)
	return slices.Compact(out)
}

// rename renames the name (a metric or label name) wherever s mentions it.
func rename(s, name string) string {
	return regexp.MustCompile(`\b`+regexp.QuoteMeta(name)+`\b`).ReplaceAllString(s, name+"_renamed")
}

// check evaluates expr (and legend, its panel's legend) on p: it must
// return series; the labels of its by clauses (but le, which
// histogram_quantile consumes) and of its legend must be on them; each
// metric it selects must have series, with every label its matchers name.
func (p *promServer) check(expr, legend string) error {
	sels := selectors(expr)
	if len(sels) == 0 {
		return fmt.Errorf("no selector found in %s", expr)
	}
	res, err := p.query(expr)
	if err != nil {
		return err
	}
	if len(res) == 0 {
		return fmt.Errorf("no series: %s", expr)
	}
	has := func(l string) bool {
		return slices.ContainsFunc(res, func(s promSeries) bool { _, ok := s.Metric[l]; return ok })
	}
	for _, l := range grouping(expr) {
		if l != "le" && !has(l) {
			return fmt.Errorf("no series has label %s of its by clause: %s", l, expr)
		}
	}
	for _, l := range legendLabels(legend) {
		if !has(l) {
			return fmt.Errorf("no series has label %s of its legend %q: %s", l, legend, expr)
		}
	}
	// Over the last 5 minutes, not at the last scrape: a scrape that timed
	// out (a busy machine) marks the target's series stale, and an instant
	// selector then finds none.
	for _, s := range sels {
		for _, l := range append([]string{""}, s.labels...) {
			q := fmt.Sprintf(`count(last_over_time(%s[5m]))`, s.metric) // the metric has series
			if l != "" {
				q = fmt.Sprintf(`count(last_over_time(%s{%s=~".+"}[5m]))`, s.metric, l)
			}
			if res, err := p.query(q); err != nil {
				return err
			} else if len(res) == 0 {
				return fmt.Errorf("no series of %s has label %s: %s", s.metric, l, expr)
			}
		}
	}
	return nil
}

// checkVariable checks a label_values(selector, label) variable: the label
// has values on the selected series.
func (p *promServer) checkVariable(sel, label string) error {
	var values []string
	if err := p.get("/api/v1/label/"+url.PathEscape(label)+"/values", url.Values{"match[]": {sel}}, &values); err != nil {
		return err
	}
	if len(values) == 0 {
		return fmt.Errorf("no values of label %s on %s", label, sel)
	}
	return nil
}

// annotationRefs returns the labels that annotations' templates name
// ($labels.x), once each.
func annotationRefs(annotations map[string]string) []string {
	var out []string
	for _, a := range annotations {
		for _, sm := range refRE.FindAllStringSubmatch(a, -1) {
			out = append(out, sm[1])
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// annotationLabels checks that every label that annotations name is one of
// the alert's labels.
func annotationLabels(annotations, labels map[string]string) error {
	for _, l := range annotationRefs(annotations) {
		if _, ok := labels[l]; !ok {
			return fmt.Errorf("its annotations name $labels.%s, which the alert does not have (labels %v)", l, labels)
		}
	}
	return nil
}

// ---- A Prometheus server ---------------------------------------------------

type promServer struct {
	base string
}

type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"` // [time, "value"]
}

type promRule struct {
	Name        string            `json:"name"`
	Query       string            `json:"query"`
	Type        string            `json:"type"`
	Annotations map[string]string `json:"annotations"`
}

type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// startPrometheus runs bin with rules, scraping each target (job name ->
// host:port) every 2 seconds and evaluating the rules every second, on a
// spare port, until the test ends.
func startPrometheus(t *testing.T, bin string, rules []byte, targets map[string]string) *promServer {
	t.Helper()
	dir := t.TempDir()
	var cfg strings.Builder
	// A scrape may take 2 s: under -race on a busy machine, one took a
	// third of a second with a core hogged, and more than 1 s (timed out,
	// the target's series stale until the next) on a starved one.
	cfg.WriteString("global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  evaluation_interval: 1s\nrule_files:\n  - rules.yml\nscrape_configs:\n")
	for _, job := range slices.Sorted(maps.Keys(targets)) {
		fmt.Fprintf(&cfg, "  - job_name: %s\n    static_configs:\n      - targets: [%q]\n", job, targets[job])
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		addr := sparePort(t)
		logs := &syncBuffer{}
		cmd := exec.Command(bin,
			"--config.file="+filepath.Join(dir, "prometheus.yml"),
			"--storage.tsdb.path="+filepath.Join(dir, fmt.Sprintf("data-%d", attempt)),
			"--web.listen-address="+addr,
			"--log.level=warn")
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		stop := func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		}
		p := &promServer{base: "http://" + addr}
		if p.ready(exited) {
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("prometheus's scrapes: %s", p.targets())
				}
				stop()
				if t.Failed() {
					t.Logf("prometheus log:\n%s", logs)
				}
			})
			return p
		}
		stop()
		if attempt == 3 || !strings.Contains(logs.String(), "address already in use") {
			t.Fatalf("prometheus did not start (attempt %d):\n%s", attempt, logs)
		}
	}
}

// targets says how the scrapes of each target went: the last one's
// duration and error (a scrape that timed out marks the target's series
// stale), for the log of a failed test.
func (p *promServer) targets() string {
	var data struct {
		ActiveTargets []struct {
			ScrapePool         string  `json:"scrapePool"`
			Health             string  `json:"health"`
			LastError          string  `json:"lastError"`
			LastScrapeDuration float64 `json:"lastScrapeDuration"`
		} `json:"activeTargets"`
	}
	if err := p.get("/api/v1/targets", nil, &data); err != nil {
		return err.Error()
	}
	var out []string
	for _, tg := range data.ActiveTargets {
		out = append(out, fmt.Sprintf("%s: %s, last scrape %.3fs %s", tg.ScrapePool, tg.Health, tg.LastScrapeDuration, tg.LastError))
	}
	up, err := p.query(`count_over_time(up[5m]) - sum_over_time(up[5m])`)
	if err == nil {
		for _, s := range up {
			out = append(out, fmt.Sprintf("%s: failed scrapes in the last 5 minutes: %v", s.Metric["job"], s.Value))
		}
	}
	return strings.Join(out, "; ")
}

// ready polls /-/ready until it answers 200, or the process exits.
func (p *promServer) ready(exited <-chan struct{}) bool {
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return false
		default:
		}
		if resp, err := http.Get(p.base + "/-/ready"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
	return false
}

func sparePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// get calls the HTTP API and decodes its data into out.
func (p *promServer) get(path string, params url.Values, out any) error {
	resp, err := http.Get(p.base + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("%s: %s: %w", path, body, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s %v: %s", path, params, r.Error)
	}
	return json.Unmarshal(r.Data, out)
}

// query runs an instant query; its result must be a vector.
func (p *promServer) query(q string) ([]promSeries, error) {
	var data struct {
		ResultType string       `json:"resultType"`
		Result     []promSeries `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {q}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: result of type %s, want vector", q, data.ResultType)
	}
	return data.Result, nil
}

// waitSeries waits until q returns at least n series. Its selectors are
// ranges (last_over_time(x[5m]), not x): a scrape that timed out, on a busy
// machine, marks the target's series stale, and an instant selector finds
// none until the next scrape succeeds.
func (p *promServer) waitSeries(t *testing.T, q string, n int) {
	t.Helper()
	testenv.Eventually(t, waitFor, fmt.Sprintf("Prometheus to return %d series for %s", n, q), func() bool {
		res, err := p.query(q)
		if err != nil {
			t.Fatal(err)
		}
		return len(res) >= n
	})
}

// repeated does something that adds to the counter selected by sel, waits
// until Prometheus has scraped the new series, then does it n times more
// and waits until Prometheus sees them: the series's first sample, which
// rate() and increase() cannot count, is followed by ones that show an
// increase of n.
func (p *promServer) repeated(t *testing.T, sel string, n int, do func()) {
	t.Helper()
	do()
	p.waitSeries(t, "last_over_time("+sel+"[5m])", 1)
	for range n {
		do()
	}
	p.waitSeries(t, fmt.Sprintf("increase(%s[5m]) >= %d", sel, n), 1)
}

func (p *promServer) alertRules(t *testing.T) []promRule {
	t.Helper()
	var data struct {
		Groups []struct {
			Rules []promRule `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get("/api/v1/rules", nil, &data); err != nil {
		t.Fatal(err)
	}
	var out []promRule
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			if r.Type == "alerting" {
				out = append(out, r)
			}
		}
	}
	return out
}

// firing returns the firing alerts by name.
func (p *promServer) firing(t *testing.T) map[string][]promAlert {
	t.Helper()
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	if err := p.get("/api/v1/alerts", nil, &data); err != nil {
		t.Fatal(err)
	}
	out := map[string][]promAlert{}
	for _, a := range data.Alerts {
		if a.State == "firing" {
			out[a.Labels["alertname"]] = append(out[a.Labels["alertname"]], a)
		}
	}
	return out
}

// syncBuffer is a bytes.Buffer safe for the writes of a process's output
// and the reads of the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// serverMemory stands for the Redis store's ServerMemory.
type serverMemory struct {
	evicted     atomic.Int64
	used, limit int64
}

func (s *serverMemory) ServerMemory(context.Context) (evicted, used, limit int64, err error) {
	return s.evicted.Load(), s.used, s.limit, nil
}
