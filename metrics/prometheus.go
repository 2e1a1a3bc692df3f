// Package inboxmetrics (import path .../inbox/metrics) implements [inboxmw.Metrics] with Prometheus, in the
// style of Watermill's own components/metrics: counters labelled by handler
// name, histograms of store call durations.
//
//	m, err := inboxmetrics.NewPrometheus(inboxmetrics.PrometheusConfig{Registerer: prometheus.DefaultRegisterer})
//	...
//	ib, err := inboxmw.New(inboxmw.Config{..., Metrics: m})
//
// It exports:
//
//   - <namespace>_inbox_messages_total{handler_name, outcome}: one count per
//     [inboxmw.Outcome] (processed, duplicate, busy, released, store_error,
//     fail_open, no_key, payload_mismatch, lease_lost, complete_retry,
//     complete_failed).
//   - <namespace>_inbox_store_call_duration_seconds{op, result}: each store
//     call, op one of try_begin, complete, release, extend, is_processed,
//     mark_processed; result "ok" or "error".
package inboxmetrics

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/middleware"
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

// Prometheus is a [inboxmw.Metrics] backed by Prometheus collectors.
type Prometheus struct {
	outcomes *prometheus.CounterVec
	calls    *prometheus.HistogramVec
}

var _ inboxmw.Metrics = (*Prometheus)(nil)

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
		}, []string{"handler_name", "outcome"}),
		calls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: cfg.Namespace, Subsystem: "inbox", Name: "store_call_duration_seconds",
			Help: "Duration of inbox store calls.", Buckets: cfg.Buckets,
		}, []string{"op", "result"}),
	}
	for _, c := range []prometheus.Collector{p.outcomes, p.calls} {
		if err := cfg.Registerer.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("metrics: inbox collectors already registered in namespace %q: %w", cfg.Namespace, err)
			}
			return nil, fmt.Errorf("metrics: registering inbox collectors: %w", err)
		}
	}
	return p, nil
}

// Outcome implements [inboxmw.Metrics].
func (p *Prometheus) Outcome(handler string, o inboxmw.Outcome) {
	p.outcomes.WithLabelValues(handler, string(o)).Inc()
}

// StoreCall implements [inboxmw.Metrics].
func (p *Prometheus) StoreCall(op string, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	p.calls.WithLabelValues(op, result).Observe(d.Seconds())
}
