// Package inboxmetrics (import path .../inbox/metrics) implements [inboxmw.Metrics] with Prometheus, in the
// style of Watermill's own components/metrics: counters labelled by handler
// name, histograms of store call durations.
//
//	m, err := inboxmetrics.NewPrometheus(inboxmetrics.PrometheusConfig{Registerer: prometheus.DefaultRegisterer})
//	...
//	ib, err := inboxmw.New(inboxmw.Config{..., Metrics: m})
//
// One Prometheus serves any number of inboxes: each series carries the bus
// and group of the inbox that reported it ([inboxmw.ScopedMetrics]). It
// exports:
//
//   - <namespace>_inbox_messages_total{bus, group, handler_name, outcome}:
//     one count per [inboxmw.Outcome] (processed, duplicate, busy, released,
//     store_error, fail_open, no_key, payload_mismatch, dead, lease_lost,
//     complete_retry, complete_failed, redelivered, redelivery_failed,
//     stale, and with an order key behind, order_blocked and order_skipped;
//     acquired goes to a Tracer only and is never counted).
//   - <namespace>_inbox_store_call_duration_seconds{bus, group, op, result}:
//     each store call, op one of try_begin, complete, release, fail,
//     extend, release_order (an order key let go past a dead key,
//     inboxmw.OrderOnDeadSkip; a plain inbox.Store's IsProcessed is a
//     try_begin, its MarkProcessed a complete), and the hand-off of a failed attempt to
//     the broker (inboxmw.Config.Redelivery), op redeliver; result "ok" or
//     "error".
//   - <namespace>_inbox_wait_seconds_total{bus, group, handler_name, reason}:
//     time messages waited in-process before their claim was settled, on a
//     busy key (reason "busy") or on a failing store ("store_backoff").
//
// The first time a handler reports, every outcome and wait reason of its
// bus, group and handler_name is exported at zero, and so are both results
// of a store call (op) the first time it is made, so that the next one
// counted is an increase Prometheus sees (increase() and rate() cannot
// tell a series that first appears at 1 from one that was always 1) and
// alert rules fire on it. Alert rules and a Grafana dashboard over these
// series are in this directory, alerts.yml and dashboard.json
// (docs/operating.md).
//
// [RegisterStore] exports how a store batches its calls (group commit: calls
// made while a round trip is in flight travel together in the next one).
// It takes any store of this project (they all sit on [driver.Store]) or any
// other with a BatchStats method ([BatchStore]), and exports:
//
//   - <namespace>_inbox_store_batch_size: a histogram of the calls
//     (TryBegin, Complete, Release, MarkProcessed) that each round trip to
//     the backend carried, with the buckets of [driver.BatchSizeBounds] (1,
//     2, 4, ..., 128, +Inf). Its _count is the round trips, its _sum the
//     calls: _sum / _count is the mean batch size. A store that does not
//     batch (memory, MongoDB, the remote client) has every round trip in
//     the first bucket. Under concurrent load, sizes above 1 are round
//     trips saved; sizes at the store's bound (128 for Redis) mean that
//     calls wait for room in a batch.
//   - <namespace>_inbox_store_round_trips_total: the round trips, as a
//     counter (the histogram's _count), for rate().
//
// Both are read from the store's counts at each scrape and cost nothing in
// between. Register each store once, with labels that tell it apart:
//
//	err := inboxmetrics.RegisterStore(prometheus.DefaultRegisterer, "", store, prometheus.Labels{"store": "orders"})
//
// For a store whose server can evict its keys (the Redis store: a
// [ServerMemoryStore]), RegisterStore also exports the server's evicted
// keys and memory headroom ([RegisterServerMemory]).
//
// [RegisterMemoryStore] exports the memory store's record count and
// evictions.
//
// [RegisterCleanup] exports what the janitor of a SQL store (or of a
// transactional one, package stores/sql/txinbox) deleted and what it left:
//
//   - <namespace>_inbox_store_cleanup_deleted_total: expired rows deleted.
//
//   - <namespace>_inbox_store_cleanup_backlog: expired rows not deleted
//     yet, counted at the end of the janitor's latest pass (up to
//     sqlstore.MaxBacklog). A janitor that keeps up leaves a few; one that
//     falls behind or fails leaves more at each pass, which the alert
//     InboxCleanupBehind of alerts.yml watches.
//
//     err := inboxmetrics.RegisterCleanup(prometheus.DefaultRegisterer, "", store, prometheus.Labels{"store": "orders"})
package inboxmetrics

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/driver"
	"github.com/watermill-inbox/inbox/stores/memory"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

// PrometheusConfig configures [NewPrometheus].
type PrometheusConfig struct {
	// Registerer receives the collectors. Required (prometheus.DefaultRegisterer
	// for the global registry).
	Registerer prometheus.Registerer
	// Namespace prefixes the metric names. Optional; default "watermill".
	Namespace string
	// Buckets of the store call histogram, in seconds. Optional; default
	// 0.0005 to 2.5 s.
	Buckets []float64
}

// Prometheus is a [inboxmw.ScopedMetrics] backed by Prometheus collectors.
// Give it to [inboxmw.Config].Metrics; the middleware scopes it to its bus
// and group. Used unscoped, its series have empty bus and group labels.
type Prometheus struct {
	outcomes *prometheus.CounterVec
	calls    *prometheus.HistogramVec
	waits    *prometheus.CounterVec
	scoped   bool      // the vectors are curried with bus and group
	handlers *sync.Map // handler names whose series are exported (at zero, at least)
	ops      *sync.Map // store calls (op) whose ok and error series are exported
}

// outcomes and waitReasons are what a handler's series are exported for
// from its first report on (acquired is never counted).
var (
	outcomes = []inboxmw.Outcome{
		inboxmw.OutcomeProcessed, inboxmw.OutcomeDuplicate, inboxmw.OutcomeBusy, inboxmw.OutcomeReleased,
		inboxmw.OutcomeStoreError, inboxmw.OutcomeFailOpen, inboxmw.OutcomeNoKey, inboxmw.OutcomePayloadMismatch,
		inboxmw.OutcomeDead, inboxmw.OutcomeLeaseLost, inboxmw.OutcomeCompleteRetry, inboxmw.OutcomeCompleteFailed,
		inboxmw.OutcomeRedelivered, inboxmw.OutcomeRedeliveryFailed, inboxmw.OutcomeStale,
		inboxmw.OutcomeBehind, inboxmw.OutcomeOrderBlocked, inboxmw.OutcomeOrderSkipped,
	}
	waitReasons = []string{inboxmw.WaitBusy, inboxmw.WaitStoreBackoff}
)

var _ inboxmw.ScopedMetrics = (*Prometheus)(nil)

// NewPrometheus creates and registers the collectors. Registering twice on
// one registry fails with prometheus.AlreadyRegisteredError.
func NewPrometheus(cfg PrometheusConfig) (*Prometheus, error) {
	if cfg.Registerer == nil {
		return nil, fmt.Errorf("%w: metrics: PrometheusConfig.Registerer is required", inbox.ErrInvalidArgument)
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "watermill"
	}
	if len(cfg.Buckets) == 0 {
		cfg.Buckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
	}
	p := &Prometheus{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: cfg.Namespace, Subsystem: "inbox", Name: "messages_total",
			Help: "Messages seen by the inbox middleware, by outcome.",
		}, []string{"bus", "group", "handler_name", "outcome"}),
		calls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: cfg.Namespace, Subsystem: "inbox", Name: "store_call_duration_seconds",
			Help: "Duration of inbox store calls.", Buckets: cfg.Buckets,
		}, []string{"bus", "group", "op", "result"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: cfg.Namespace, Subsystem: "inbox", Name: "wait_seconds_total",
			Help: "Time messages waited in-process before their claim was settled: on a busy key, or backing off a failing store.",
		}, []string{"bus", "group", "handler_name", "reason"}),
		handlers: new(sync.Map), ops: new(sync.Map),
	}
	if err := register(cfg.Registerer, cfg.Namespace, p.outcomes, p.calls, p.waits); err != nil {
		return nil, err
	}
	return p, nil
}

func register(reg prometheus.Registerer, namespace string, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return fmt.Errorf("metrics: inbox collectors already registered in namespace %q: %w", namespace, err)
			}
			return fmt.Errorf("metrics: registering inbox collectors: %w", err)
		}
	}
	return nil
}

// Scope implements [inboxmw.ScopedMetrics]: the returned Metrics labels its
// series with bus and group.
func (p *Prometheus) Scope(bus, group string) inboxmw.Metrics {
	l := prometheus.Labels{"bus": bus, "group": group}
	return &Prometheus{
		outcomes: p.outcomes.MustCurryWith(l), calls: p.calls.MustCurryWith(l).(*prometheus.HistogramVec),
		waits: p.waits.MustCurryWith(l), scoped: true, handlers: new(sync.Map), ops: new(sync.Map),
	}
}

// seen exports every outcome and wait reason of handler at zero, the first
// time handler reports.
func (p *Prometheus) seen(handler string) {
	if _, loaded := p.handlers.LoadOrStore(handler, struct{}{}); loaded {
		return
	}
	for _, o := range outcomes {
		p.outcomes.With(p.scope(prometheus.Labels{"handler_name": handler, "outcome": string(o)}))
	}
	for _, r := range waitReasons {
		p.waits.With(p.scope(prometheus.Labels{"handler_name": handler, "reason": r}))
	}
}

// scope completes l with empty bus and group labels when p is not scoped.
func (p *Prometheus) scope(l prometheus.Labels) prometheus.Labels {
	if !p.scoped {
		l["bus"], l["group"] = "", ""
	}
	return l
}

// Outcome implements [inboxmw.Metrics].
func (p *Prometheus) Outcome(handler string, o inboxmw.Outcome) {
	p.seen(handler)
	p.outcomes.With(p.scope(prometheus.Labels{"handler_name": handler, "outcome": string(o)})).Inc()
}

// StoreCall implements [inboxmw.Metrics].
func (p *Prometheus) StoreCall(op string, d time.Duration, err error) {
	if _, loaded := p.ops.LoadOrStore(op, struct{}{}); !loaded {
		for _, r := range []string{"ok", "error"} {
			p.calls.With(p.scope(prometheus.Labels{"op": op, "result": r}))
		}
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	p.calls.With(p.scope(prometheus.Labels{"op": op, "result": result})).Observe(d.Seconds())
}

// Waited implements [inboxmw.Metrics].
func (p *Prometheus) Waited(handler, reason string, d time.Duration) {
	p.seen(handler)
	p.waits.With(p.scope(prometheus.Labels{"handler_name": handler, "reason": reason})).Add(d.Seconds())
}

// RegisterMemoryStore exports the Stats of a memory store on reg:
// <namespace>_inbox_memory_records (a gauge) and
// <namespace>_inbox_memory_evictions_total (records removed before their
// expiry to stay within MaxEntries, each shortening a key's dedup window:
// worth an alert). labels are constant labels telling stores apart (nil
// for none). namespace defaults to "watermill".
func RegisterMemoryStore(reg prometheus.Registerer, namespace string, s *memory.Store, labels prometheus.Labels) error {
	if namespace == "" {
		namespace = "watermill"
	}
	records := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: "inbox", Name: "memory_records", ConstLabels: labels,
		Help: "Records held by the in-memory inbox store, expired ones not yet swept included.",
	}, func() float64 { return float64(s.Stats().Entries) })
	evicted := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "inbox", Name: "memory_evictions_total", ConstLabels: labels,
		Help: "Records the in-memory inbox store removed before their expiry to stay within MaxEntries.",
	}, func() float64 { return float64(s.Stats().Evicted) })
	return register(reg, namespace, records, evicted)
}

// BatchStore is a store that counts its round trips: every store of this
// project, through its embedded [driver.Store].
type BatchStore interface {
	BatchStats() driver.BatchStats
}

// RegisterStore exports the batch sizes of s on reg:
// <namespace>_inbox_store_batch_size (a histogram) and
// <namespace>_inbox_store_round_trips_total (a counter); see the package
// documentation. When s is a [ServerMemoryStore], it also calls
// [RegisterServerMemory]. labels are constant labels telling stores apart (nil for
// none); two stores on one registry need different ones. namespace
// defaults to "watermill". The figures are read from s.BatchStats at each
// scrape.
func RegisterStore(reg prometheus.Registerer, namespace string, s BatchStore, labels prometheus.Labels) error {
	switch {
	case reg == nil:
		return fmt.Errorf("%w: metrics: RegisterStore: Registerer is nil", inbox.ErrInvalidArgument)
	case s == nil:
		return fmt.Errorf("%w: metrics: RegisterStore: store is nil", inbox.ErrInvalidArgument)
	}
	if namespace == "" {
		namespace = "watermill"
	}
	err := register(reg, namespace, &batchCollector{
		s: s,
		size: prometheus.NewDesc(prometheus.BuildFQName(namespace, "inbox", "store_batch_size"),
			"Store calls carried by each round trip to the backend (group commit).", nil, labels),
		trips: prometheus.NewDesc(prometheus.BuildFQName(namespace, "inbox", "store_round_trips_total"),
			"Round trips of batched store calls to the backend.", nil, labels),
	})
	if m, ok := s.(ServerMemoryStore); ok && err == nil {
		err = RegisterServerMemory(reg, namespace, m, labels)
	}
	return err
}

// batchCollector turns a store's BatchStats into metrics at scrape time.
type batchCollector struct {
	s           BatchStore
	size, trips *prometheus.Desc
}

func (c *batchCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.size
	ch <- c.trips
}

func (c *batchCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.BatchStats()
	// The count is the sum of the buckets, not st.RoundTrips: the store's
	// counters are read one by one while calls go on, and a histogram whose
	// buckets exceed its count would be inconsistent.
	buckets := make(map[float64]uint64, len(driver.BatchSizeBounds))
	var count uint64
	for i, n := range st.Sizes {
		count += n
		if i < len(driver.BatchSizeBounds) {
			buckets[float64(driver.BatchSizeBounds[i])] = count
		}
	}
	ch <- prometheus.MustNewConstHistogram(c.size, count, float64(st.Calls), buckets)
	ch <- prometheus.MustNewConstMetric(c.trips, prometheus.CounterValue, float64(count))
}

// CleanupStore is a store whose janitor deletes expired records: the SQL
// store (*sqlstore.Store) and the transactional one (*txinbox.Store).
type CleanupStore interface {
	CleanupStats() sqlstore.CleanupStats
}

// RegisterCleanup exports the cleanup of s on reg:
// <namespace>_inbox_store_cleanup_deleted_total (a counter) and
// <namespace>_inbox_store_cleanup_backlog (a gauge, exported once the
// janitor has counted it, after its first pass); see the package
// documentation. labels are constant labels telling stores apart (nil for
// none); two stores on one registry need different ones. namespace
// defaults to "watermill". The figures are read from s.CleanupStats at
// each scrape, which sends nothing to the database.
func RegisterCleanup(reg prometheus.Registerer, namespace string, s CleanupStore, labels prometheus.Labels) error {
	switch {
	case reg == nil:
		return fmt.Errorf("%w: metrics: RegisterCleanup: Registerer is nil", inbox.ErrInvalidArgument)
	case s == nil:
		return fmt.Errorf("%w: metrics: RegisterCleanup: store is nil", inbox.ErrInvalidArgument)
	}
	if namespace == "" {
		namespace = "watermill"
	}
	return register(reg, namespace, &cleanupCollector{
		s: s,
		deleted: prometheus.NewDesc(prometheus.BuildFQName(namespace, "inbox", "store_cleanup_deleted_total"),
			"Expired rows the store's cleanup deleted.", nil, labels),
		backlog: prometheus.NewDesc(prometheus.BuildFQName(namespace, "inbox", "store_cleanup_backlog"),
			"Expired rows not deleted yet, counted at the end of the janitor's latest pass.", nil, labels),
	})
}

// cleanupCollector turns a store's CleanupStats into metrics at scrape time.
type cleanupCollector struct {
	s                CleanupStore
	deleted, backlog *prometheus.Desc
}

func (c *cleanupCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.deleted
	ch <- c.backlog
}

func (c *cleanupCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.CleanupStats()
	ch <- prometheus.MustNewConstMetric(c.deleted, prometheus.CounterValue, float64(st.Deleted))
	if !st.Counted.IsZero() {
		ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(st.Backlog))
	}
}
