package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	inboxmetrics "github.com/watermill-inbox/inbox/metrics"
	"github.com/watermill-inbox/inbox/stores"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
)

// gatherValue returns the value of the one series of name in reg, and
// whether there is one.
func gatherValue(t *testing.T, reg *prometheus.Registry, name string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		if len(mf.GetMetric()) != 1 {
			t.Fatalf("%s has %d series, want 1", name, len(mf.GetMetric()))
		}
		m := mf.GetMetric()[0]
		if m.GetCounter() != nil {
			return m.GetCounter().GetValue(), true
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

// A server whose maxmemory-policy can evict the store's keys (volatile-lru:
// every record has a TTL) is refused at Open, naming the policy, unless the
// URL accepts it; accepted, with a small maxmemory, the keys it evicts are
// counted by the store's metrics, and its headroom is exported.
func TestOpen_eviction_policy(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{Args: []string{"--maxmemory-policy", "volatile-lru"}})
	ctx := context.Background()
	url := "redis://" + srv.Addr() + "/0?timeout=5s"
	s, err := stores.Open(ctx, url)
	if err == nil {
		_ = s.Close()
		t.Fatal("Open of a volatile-lru server succeeded")
	}
	if !errors.Is(err, redisstore.ErrEvictionPolicy) || !errors.Is(err, stores.ErrMisconfigured) || !strings.Contains(err.Error(), "volatile-lru") ||
		!strings.Contains(err.Error(), "allow_eviction=true") {
		t.Fatalf("Open = %v; want ErrEvictionPolicy and ErrMisconfigured, naming volatile-lru and allow_eviction=true", err)
	}
	if _, err := stores.Open(ctx, url+"&allow_eviction=maybe"); !errors.Is(err, stores.ErrInvalidURL) || !strings.Contains(err.Error(), "allow_eviction") {
		t.Fatalf("Open with allow_eviction=maybe = %v, want ErrInvalidURL naming it", err)
	}

	st, err := stores.Open(ctx, url+"&allow_eviction=true&retention=1h")
	if err != nil {
		t.Fatalf("Open with allow_eviction=true: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	rs := st.(*redisstore.Store)
	reg := prometheus.NewRegistry()
	if err := inboxmetrics.RegisterStore(reg, "", rs, prometheus.Labels{"store": "orders"}); err != nil {
		t.Fatal(err)
	}
	if v, ok := gatherValue(t, reg, "watermill_inbox_store_evicted_keys_total"); !ok || v != 0 {
		t.Fatalf("evicted keys before any eviction = %v (exported: %v), want 0", v, ok)
	}
	if _, ok := gatherValue(t, reg, "watermill_inbox_store_memory_headroom_bytes"); ok {
		t.Fatal("headroom exported for a server without maxmemory")
	}

	// Room for a few thousand keys more than the server holds now.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	_, used, _, err := rs.ServerMemory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	limit := used + 512<<10
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(limit, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 20_000
	for i := range n {
		k := "rabbit:billing:orders:" + strconv.Itoa(i)
		cl, err := rs.TryBegin(ctx, k, inbox.BeginOptions{})
		if err != nil || cl.Status != inbox.Acquired {
			t.Fatalf("TryBegin(%s) = %+v, %v", k, cl, err)
		}
		if err := rs.Complete(ctx, k, cl.LeaseID); err != nil {
			t.Fatalf("Complete(%s): %v", k, err)
		}
	}
	keys, err := c.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	evicted, ok := gatherValue(t, reg, "watermill_inbox_store_evicted_keys_total")
	if !ok || evicted <= 0 || evicted < float64(n-keys) {
		t.Fatalf("evicted keys = %v (exported: %v), want at least the %d keys the server lost", evicted, ok, n-keys)
	}
	if v, ok := gatherValue(t, reg, "watermill_inbox_store_memory_limit_bytes"); !ok || v != float64(limit) {
		t.Fatalf("memory limit = %v (exported: %v), want %d", v, ok, limit)
	}
	if v, ok := gatherValue(t, reg, "watermill_inbox_store_memory_headroom_bytes"); !ok || v > float64(limit)/10 {
		t.Fatalf("headroom = %v (exported: %v), want less than a tenth of the limit %d on a full server", v, ok, limit)
	}
	t.Logf("%d of %d processed keys kept, %.0f evicted", keys, n, evicted)
}

// A server that hides CONFIG (renamed, as managed services do) cannot tell
// the store its policy: Open logs one warning and opens.
func TestOpen_eviction_policy_hidden(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{Args: []string{"--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", ""}})
	l := watermill.NewCaptureLogger()
	redisstore.SetLogger(l)
	defer redisstore.SetLogger(nil)
	st, err := stores.Open(context.Background(), "redis://"+srv.Addr()+"/0?timeout=5s")
	if err != nil {
		t.Fatalf("Open of a server without CONFIG: %v", err)
	}
	_ = st.Close()
	var warned int
	for _, m := range l.Captured()[watermill.InfoLogLevel] {
		if strings.Contains(m.Msg, srv.Addr()+" refused CONFIG GET maxmemory-policy") && m.Fields["level"] == "warning" {
			warned++
		}
	}
	if warned != 1 {
		t.Fatalf("%d warnings about the hidden policy, want 1; logged: %v", warned, l.Captured())
	}
}
