package inboxmetrics_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/metrics"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
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
	want := `
# HELP watermill_inbox_messages_total Messages seen by the inbox middleware, by outcome.
# TYPE watermill_inbox_messages_total counter
watermill_inbox_messages_total{bus="rabbit",group="billing",handler_name="",outcome="duplicate"} 1
watermill_inbox_messages_total{bus="rabbit",group="billing",handler_name="",outcome="processed"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "watermill_inbox_messages_total"); err != nil {
		t.Fatal(err)
	}
	// try_begin twice and complete once, all ok.
	if n := testutil.CollectAndCount(reg, "watermill_inbox_store_call_duration_seconds"); n != 2 {
		t.Fatalf("%d store call series, want 2 (try_begin and complete)", n)
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
watermill_inbox_wait_seconds_total{bus="",group="",handler_name="charge",reason="store_backoff"} 1.5
watermill_inbox_wait_seconds_total{bus="kafka",group="g",handler_name="charge",reason="busy"} 1
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
