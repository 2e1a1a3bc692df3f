package inboxmetrics_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/metrics"
	"github.com/watermill-inbox/inbox/stores/driver"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// memoryServerStore is a store of this project whose server reports its
// memory, as the Redis store does (stores/redis tests the real one).
type memoryServerStore struct {
	*driver.Store
	serverMemory
	fail bool
}

func (s *memoryServerStore) ServerMemory(ctx context.Context) (int64, int64, int64, error) {
	if s.fail {
		return 0, 0, 0, inbox.ErrStoreUnavailable
	}
	return s.serverMemory.ServerMemory(ctx)
}

// RegisterStore exports the server's evicted keys, limit and headroom for a
// store that reports them; the limit and headroom only when the server has
// a limit, nothing when the report fails.
func TestRegisterStore_server_memory(t *testing.T) {
	t.Parallel()
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	s := &memoryServerStore{Store: mem.Store}
	s.evicted.Store(12)
	s.used, s.limit = 900, 1000
	reg := prometheus.NewRegistry()
	if err := inboxmetrics.RegisterStore(reg, "", s, prometheus.Labels{"store": "orders"}); err != nil {
		t.Fatal(err)
	}
	names := []string{"watermill_inbox_store_evicted_keys_total", "watermill_inbox_store_memory_limit_bytes", "watermill_inbox_store_memory_headroom_bytes"}
	want := `# HELP watermill_inbox_store_evicted_keys_total Keys the store's server evicted to stay within its memory limit (the server's evicted_keys).
# TYPE watermill_inbox_store_evicted_keys_total counter
watermill_inbox_store_evicted_keys_total{store="orders"} 12
# HELP watermill_inbox_store_memory_headroom_bytes Memory the store's server has left before its limit (maxmemory - used_memory), when it has one.
# TYPE watermill_inbox_store_memory_headroom_bytes gauge
watermill_inbox_store_memory_headroom_bytes{store="orders"} 100
# HELP watermill_inbox_store_memory_limit_bytes The memory limit of the store's server (maxmemory), when it has one.
# TYPE watermill_inbox_store_memory_limit_bytes gauge
watermill_inbox_store_memory_limit_bytes{store="orders"} 1000
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	s.limit = 0
	if n, err := testutil.GatherAndCount(reg, names...); err != nil || n != 1 {
		t.Fatalf("%d series of a server without a limit (%v), want the evicted keys only", n, err)
	}
	s.fail = true
	if n, err := testutil.GatherAndCount(reg, names...); err != nil || n != 0 {
		t.Fatalf("%d series while the report fails (%v), want none", n, err)
	}
	if err := inboxmetrics.RegisterServerMemory(nil, "", s, nil); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Fatalf("RegisterServerMemory without a Registerer = %v, want ErrInvalidArgument", err)
	}
	if err := inboxmetrics.RegisterServerMemory(prometheus.NewRegistry(), "", nil, nil); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Fatalf("RegisterServerMemory without a store = %v, want ErrInvalidArgument", err)
	}
}
