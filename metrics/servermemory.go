package inboxmetrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-inbox/inbox"
)

// ServerMemoryStore is a store whose server can run out of memory and
// evict its keys: the Redis store (package redisstore) is one. Its
// ServerMemory returns the keys the server has evicted since it started,
// and its used memory and limit in bytes (limit 0: none).
type ServerMemoryStore interface {
	ServerMemory(ctx context.Context) (evicted, used, limit int64, err error)
}

// ServerMemoryTimeout bounds each scrape's ServerMemory call.
const ServerMemoryTimeout = 5 * time.Second

// RegisterServerMemory exports the memory of the server under s on reg,
// read at each scrape (within [ServerMemoryTimeout]; a scrape whose call
// fails exports none of them):
//
//   - <namespace>_inbox_store_evicted_keys_total: the keys the server
//     evicted to stay within its memory limit (a counter; it restarts with
//     the server). Each evicted inbox key that was processed is a message
//     that runs again when it is delivered again: worth an alert.
//   - <namespace>_inbox_store_memory_limit_bytes and
//     <namespace>_inbox_store_memory_headroom_bytes: the server's limit
//     (maxmemory) and what is left of it (maxmemory - used_memory), both
//     absent when the server has no limit.
//
// [RegisterStore] calls it for a store that has ServerMemory. labels are
// constant labels telling stores apart (nil for none). namespace defaults
// to "watermill".
func RegisterServerMemory(reg prometheus.Registerer, namespace string, s ServerMemoryStore, labels prometheus.Labels) error {
	switch {
	case reg == nil:
		return fmt.Errorf("%w: metrics: RegisterServerMemory: Registerer is nil", inbox.ErrInvalidArgument)
	case s == nil:
		return fmt.Errorf("%w: metrics: RegisterServerMemory: store is nil", inbox.ErrInvalidArgument)
	}
	if namespace == "" {
		namespace = "watermill"
	}
	name := func(n string) string { return prometheus.BuildFQName(namespace, "inbox", n) }
	return register(reg, namespace, &memoryCollector{
		s: s,
		evicted: prometheus.NewDesc(name("store_evicted_keys_total"),
			"Keys the store's server evicted to stay within its memory limit (the server's evicted_keys).", nil, labels),
		limit: prometheus.NewDesc(name("store_memory_limit_bytes"),
			"The memory limit of the store's server (maxmemory), when it has one.", nil, labels),
		headroom: prometheus.NewDesc(name("store_memory_headroom_bytes"),
			"Memory the store's server has left before its limit (maxmemory - used_memory), when it has one.", nil, labels),
	})
}

// memoryCollector turns a store's ServerMemory into metrics at scrape time.
type memoryCollector struct {
	s                        ServerMemoryStore
	evicted, limit, headroom *prometheus.Desc
}

func (c *memoryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.evicted
	ch <- c.limit
	ch <- c.headroom
}

func (c *memoryCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), ServerMemoryTimeout)
	defer cancel()
	evicted, used, limit, err := c.s.ServerMemory(ctx)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.evicted, prometheus.CounterValue, float64(evicted))
	if limit > 0 {
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(limit))
		ch <- prometheus.MustNewConstMetric(c.headroom, prometheus.GaugeValue, float64(limit-used))
	}
}
