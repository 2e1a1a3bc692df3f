package inboxmetrics_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/metrics"
	"github.com/watermill-inbox/inbox/middleware"
)

func TestPrometheus_counts_outcomes_and_times_calls(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := inboxmetrics.NewPrometheus(inboxmetrics.PrometheusConfig{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	m.Outcome("charge", inboxmw.OutcomeProcessed)
	m.Outcome("charge", inboxmw.OutcomeProcessed)
	m.Outcome("charge", inboxmw.OutcomeDuplicate)
	m.StoreCall(inboxmw.OpTryBegin, 3*time.Millisecond, nil)
	m.StoreCall(inboxmw.OpTryBegin, time.Second, errors.New("down"))

	want := `
# HELP watermill_inbox_messages_total Messages seen by the inbox middleware, by outcome.
# TYPE watermill_inbox_messages_total counter
watermill_inbox_messages_total{handler_name="charge",outcome="duplicate"} 1
watermill_inbox_messages_total{handler_name="charge",outcome="processed"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "watermill_inbox_messages_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "watermill_inbox_store_call_duration_seconds"); n != 2 {
		t.Fatalf("%d store call series, want 2 (ok and error)", n)
	}
	if _, err := inboxmetrics.NewPrometheus(inboxmetrics.PrometheusConfig{Registerer: reg}); err == nil {
		t.Fatal("registering twice on one registry succeeded")
	}
	if _, err := inboxmetrics.NewPrometheus(inboxmetrics.PrometheusConfig{}); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Fatalf("missing registerer: %v", err)
	}
}
