package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
)

// pipelineCounter is a go-redis hook that counts pipelines and the largest
// one seen.
type pipelineCounter struct {
	pipelines, largest atomic.Int64
}

func (h *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipelines.Add(1)
		for {
			l := h.largest.Load()
			if int64(len(cmds)) <= l || h.largest.CompareAndSwap(l, int64(len(cmds))) {
				break
			}
		}
		return next(ctx, cmds)
	}
}

// batchedCalls runs, from many goroutines at once, claims of new keys,
// claims of one shared key, Completes and Releases, checks their results
// and returns how many calls were made.
func batchedCalls(t *testing.T, s *redisstore.Store) int {
	t.Helper()
	ctx := context.Background()
	const workers, per = 32, 20
	var acquiredShared atomic.Int32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				key := fmt.Sprintf("batch:%d:%d", w, i)
				c, err := s.TryBegin(ctx, key, inbox.BeginOptions{Lease: time.Minute})
				if err != nil || c.Status != inbox.Acquired {
					t.Errorf("TryBegin %s: %+v, %v", key, c, err)
					return
				}
				if i%2 == 0 {
					err = s.Complete(ctx, key, c.LeaseID)
				} else {
					err = s.Release(ctx, key, c.LeaseID)
				}
				if err != nil {
					t.Errorf("settle %s: %v", key, err)
				}
				if err := s.Release(ctx, key, "not-the-lease"); !errors.Is(err, inbox.ErrLeaseLost) {
					t.Errorf("Release %s by a stranger: %v, want ErrLeaseLost", key, err)
				}
			}
			c, err := s.TryBegin(ctx, "batch:shared", inbox.BeginOptions{Lease: time.Minute})
			if err != nil {
				t.Errorf("TryBegin shared: %v", err)
			} else if c.Status == inbox.Acquired {
				acquiredShared.Add(1)
			} else if c.Status != inbox.Busy {
				t.Errorf("TryBegin shared: %+v", c)
			}
		}()
	}
	wg.Wait()
	if n := acquiredShared.Load(); n != 1 {
		t.Errorf("%d claims of one key acquired it, want exactly 1", n)
	}
	for w := range workers {
		for i := range per {
			key := fmt.Sprintf("batch:%d:%d", w, i)
			r, err := s.Get(ctx, key)
			want := inbox.StateProcessed
			if i%2 == 1 {
				want = inbox.StateAvailable
			}
			if err != nil || r.State != want {
				t.Errorf("Get %s: %+v, %v, want %v", key, r, err, want)
			}
		}
	}
	return workers*per*3 + workers
}

func TestBatching_concurrent_calls_share_round_trips(t *testing.T) {
	c := sharedClient(t)
	h := &pipelineCounter{}
	c.AddHook(h)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	calls := batchedCalls(t, s)
	t.Logf("%d calls in %d pipelines, the largest of %d commands", calls, h.pipelines.Load(), h.largest.Load())
	if h.largest.Load() <= 2 {
		t.Errorf("no pipeline carried more than one call (largest %d commands)", h.largest.Load())
	}
}

func TestBatching_cluster(t *testing.T) {
	addrs := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	batchedCalls(t, s)
	// Batches whose keys are on several nodes, with operations on one key
	// in order.
	runBatchOrder(t, c, nil)
}

func TestBatching_canceled_while_queued(t *testing.T) {
	c := sharedClient(t)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	ctx := context.Background()
	// Many callers, most of them with a context already ending: none may
	// hang, and each gets either its result or its context's error.
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, time.Duration(i%4)*20*time.Microsecond)
			defer cancel()
			_, err := s.TryBegin(cctx, fmt.Sprintf("cq:%d", i), inbox.BeginOptions{})
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("TryBegin %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
}
