package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/internal/testenv"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
)

// holder is what the churn test knows of a lease it was granted.
type holder struct {
	leaseID   string
	releasing bool // Release was sent: the server may have freed the key already
}

// churn runs workers that claim, complete and release keys of a small key
// space until stopped, and checks each outcome against what it was told:
// no key is granted to two holders at once, and no key reported completed
// is ever acquired again.
type churn struct {
	t     *testing.T
	st    inbox.LeaseStore
	keys  []string
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	held  map[string]holder
	done  map[string]bool // Complete returned nil
	ops   atomic.Int64    // successful store calls
	comps atomic.Int64    // successful Completes
	errs  atomic.Int64    // store calls that failed with ErrStoreUnavailable
}

func startChurn(t *testing.T, st inbox.LeaseStore, workers, keys int) *churn {
	c := &churn{t: t, st: st, stop: make(chan struct{}), held: map[string]holder{}, done: map[string]bool{}}
	for i := range keys {
		c.keys = append(c.keys, "churn:"+strconv.Itoa(i))
	}
	for w := range workers {
		c.wg.Add(1)
		go c.work(w)
	}
	t.Cleanup(c.halt)
	return c
}

func (c *churn) halt() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.wg.Wait()
}

func (c *churn) stopped() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// storeErr accepts err only when it is an outage error.
func (c *churn) storeErr(what string, err error) {
	if !errors.Is(err, inbox.ErrStoreUnavailable) {
		c.t.Errorf("%s: %v, want an error wrapping ErrStoreUnavailable", what, err)
	}
	c.errs.Add(1)
	time.Sleep(5 * time.Millisecond) // back off from a down server, not synchronisation
}

func (c *churn) work(w int) {
	defer c.wg.Done()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	for !c.stopped() {
		key := c.keys[rng.IntN(len(c.keys))]
		cl, err := c.st.TryBegin(ctx, key, inbox.BeginOptions{Lease: time.Minute, Owner: fmt.Sprint("worker-", w)})
		if err != nil {
			c.storeErr("TryBegin", err)
			continue
		}
		c.ops.Add(1)
		if cl.Status != inbox.Acquired {
			continue
		}
		c.mu.Lock()
		if h, ok := c.held[key]; ok && !h.releasing {
			c.t.Errorf("key %s granted to lease %s while lease %s holds it", key, cl.LeaseID, h.leaseID)
		}
		if c.done[key] {
			c.t.Errorf("key %s acquired by lease %s after it was reported completed", key, cl.LeaseID)
		}
		complete := rng.IntN(2) == 0
		c.held[key] = holder{leaseID: cl.LeaseID, releasing: !complete}
		c.mu.Unlock()

		if complete {
			c.finish(key, "Complete", func() error { return c.st.Complete(ctx, key, cl.LeaseID) })
			c.mu.Lock()
			c.done[key] = true
			delete(c.held, key)
			c.mu.Unlock()
			c.comps.Add(1)
		} else {
			c.finish(key, "Release", func() error {
				err := c.st.Release(ctx, key, cl.LeaseID)
				if errors.Is(err, inbox.ErrLeaseLost) {
					return nil // an earlier try was applied but its reply lost
				}
				return err
			})
			c.mu.Lock()
			if c.held[key].leaseID == cl.LeaseID {
				delete(c.held, key)
			}
			c.mu.Unlock()
		}
	}
}

// finish retries a holder's call through an outage until it succeeds: the
// holder keeps its lease meanwhile.
func (c *churn) finish(key, what string, call func() error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := call()
		if err == nil {
			c.ops.Add(1)
			return
		}
		if errors.Is(err, inbox.ErrLeaseLost) {
			c.t.Errorf("%s of %s by its holder: %v (the store lost the lease)", what, key, err)
			return
		}
		c.storeErr(what, err)
		if time.Now().After(deadline) {
			c.t.Errorf("%s of %s still failing after 2 minutes: %v", what, key, err)
			return
		}
	}
}

// waitCompletions polls until n more Completes succeeded than now.
func (c *churn) waitCompletions(n int64, what string) {
	c.t.Helper()
	target := c.comps.Load() + n
	deadline := time.Now().Add(90 * time.Second)
	for c.comps.Load() < target {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: %d of %d completions after 90s", what, c.comps.Load(), target)
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
}

// verify stops the workers and checks every completed key is processed.
func (c *churn) verify() {
	c.t.Helper()
	c.halt()
	c.mu.Lock()
	defer c.mu.Unlock()
	for key := range c.done {
		r, err := c.st.Get(context.Background(), key)
		if err != nil {
			c.t.Fatalf("Get(%s) after the run: %v", key, err)
		}
		if r.State != inbox.StateProcessed {
			c.t.Errorf("key %s was reported completed but is %v now: a processed mark was lost", key, r.State)
		}
	}
	c.t.Logf("%d calls succeeded, %d failed with ErrStoreUnavailable, %d keys completed", c.ops.Load(), c.errs.Load(), len(c.done))
}

func privateStore(t *testing.T, srv *redistest.Server) (*redisstore.Store, *redis.Client) {
	// No retries inside go-redis: the outage must reach the store's callers.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, redisstore.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func TestStore_script_flush_mid_run(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{AppendOnly: true})
	st, c := privateStore(t, srv)
	ch := startChurn(t, st, 8, 2000)
	ch.waitCompletions(50, "before SCRIPT FLUSH")
	for range 10 {
		if err := c.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
		ch.waitCompletions(10, "after SCRIPT FLUSH")
	}
	ch.verify()
	if n := ch.errs.Load(); n != 0 {
		t.Fatalf("%d calls failed across SCRIPT FLUSH; the EVAL fallback should hide an empty script cache", n)
	}
}

func TestStore_restart_mid_run(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"shutdown", "kill"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.Config{AppendOnly: true})
			st, _ := privateStore(t, srv)
			ch := startChurn(t, st, 8, 2000)
			ch.waitCompletions(100, "before the restart")
			errsBefore := ch.errs.Load()
			if mode == "kill" {
				srv.Kill() // a crash: appendfsync always has every acknowledged write on disk
			} else {
				srv.Shutdown()
			}
			// Stay down until every worker has been refused at least twice.
			deadline := time.Now().Add(30 * time.Second)
			for ch.errs.Load() < errsBefore+16 {
				if time.Now().After(deadline) {
					t.Fatalf("only %d calls failed in 30s with the server down", ch.errs.Load()-errsBefore)
				}
				time.Sleep(5 * time.Millisecond) // polling interval
			}
			srv.Restart()
			ch.waitCompletions(100, "after the restart")
			ch.verify()
		})
	}
}

// hasCause reports whether err carries a network-level cause besides the
// store's sentinel.
func hasCause(err error) bool {
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &ne) || errors.As(err, &oe) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF)
}

// allOps runs every store operation on key with leaseID and returns their
// errors by name.
func allOps(ctx context.Context, st inbox.LeaseStore, key, leaseID string) map[string]error {
	errs := map[string]error{}
	_, errs["TryBegin"] = st.TryBegin(ctx, key, inbox.BeginOptions{})
	errs["Complete"] = st.Complete(ctx, key, leaseID)
	errs["Release"] = st.Release(ctx, key, leaseID)
	_, errs["Extend"] = st.Extend(ctx, key, leaseID, time.Minute)
	_, errs["Get"] = st.Get(ctx, key)
	_, errs["IsProcessed"] = st.IsProcessed(ctx, key)
	errs["MarkProcessed"] = st.MarkProcessed(ctx, key)
	errs["Fail"] = st.Fail(ctx, key, leaseID, inbox.FailOptions{RetryAfter: time.Second})
	if a, ok := st.(inbox.Admin); ok {
		errs["Forget"] = a.Forget(ctx, key)
		errs["ForceRelease"] = a.ForceRelease(ctx, key)
		_, errs["List"] = a.List(ctx, inbox.ListOptions{Prefix: key})
	}
	return errs
}

// proxiedOptions are the shared Redis's client options with the address of
// proxy p.
func proxiedOptions(t *testing.T, p *faultproxy.Proxy) *redis.Options {
	o, err := redis.ParseURL(testenv.Redis.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	o.Addr = p.Addr()
	o.ContextTimeoutEnabled = true
	return o
}

func TestStore_connection_refused_then_recovers(t *testing.T) {
	t.Parallel()
	shared := sharedClient(t)
	p := faultproxy.New(t, shared.Options().Addr)
	o := proxiedOptions(t, p)
	o.MaxRetries = 1
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	st := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, shared), Timeout: 3 * time.Second})
	ctx := context.Background()

	key := "refused"
	cl, err := st.TryBegin(ctx, key, inbox.BeginOptions{Lease: time.Minute})
	if err != nil || cl.Status != inbox.Acquired {
		t.Fatalf("TryBegin before the cut: %+v, %v", cl, err)
	}
	p.Cut()
	for op, err := range allOps(ctx, st, key, cl.LeaseID) {
		if !errors.Is(err, inbox.ErrStoreUnavailable) || !hasCause(err) {
			t.Errorf("%s through a cut link: %v, want ErrStoreUnavailable wrapping the network error", op, err)
		}
	}
	p.Restore()
	// The client reconnects by itself; the lease granted before the cut still
	// holds and its holder completes.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := st.Complete(ctx, key, cl.LeaseID)
		if err == nil {
			break
		}
		if !errors.Is(err, inbox.ErrStoreUnavailable) || time.Now().After(deadline) {
			t.Fatalf("Complete after the link was restored: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	if ok, err := st.IsProcessed(ctx, key); err != nil || !ok {
		t.Fatalf("IsProcessed after recovery = %v, %v; want true", ok, err)
	}
}

func TestStore_nothing_listening_is_unavailable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	st := newStore(t, c, redisstore.Options{Prefix: "unused:"})
	for op, err := range allOps(context.Background(), st, "k", inbox.NewLeaseID()) {
		if !errors.Is(err, inbox.ErrStoreUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s with nothing listening: %v, want ErrStoreUnavailable wrapping ECONNREFUSED", op, err)
		}
	}
}

func TestStore_stalled_link_times_out(t *testing.T) {
	t.Parallel()
	shared := sharedClient(t)
	p := faultproxy.New(t, shared.Options().Addr)
	c := redis.NewClient(proxiedOptions(t, p))
	t.Cleanup(func() { _ = c.Close() })
	const timeout = 300 * time.Millisecond
	st := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, shared), Timeout: timeout})
	p.Stall()
	start := time.Now()
	_, err := st.TryBegin(context.Background(), "stalled", inbox.BeginOptions{})
	took := time.Since(start)
	if !errors.Is(err, inbox.ErrStoreUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryBegin through a stalled link: %v, want ErrStoreUnavailable and DeadlineExceeded", err)
	}
	if took < timeout || took > timeout+10*time.Second {
		t.Fatalf("TryBegin through a stalled link returned after %s, want about the %s timeout", took, timeout)
	}
	// The caller's own cancellation is reported as such, not as an outage.
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(50 * time.Millisecond) // lets the call reach the stalled link; any moment works
		cancel()
	}()
	_, err = st.Get(ctx, "stalled")
	if !errors.Is(err, context.Canceled) || errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("Get canceled by its caller: %v, want context.Canceled only", err)
	}
}

// With a negative Options.Timeout the store adds no bound of its own: the
// caller's deadline is what ends a call on a stalled link.
func TestStore_no_timeout_uses_callers_deadline(t *testing.T) {
	t.Parallel()
	shared := sharedClient(t)
	p := faultproxy.New(t, shared.Options().Addr)
	c := redis.NewClient(proxiedOptions(t, p))
	t.Cleanup(func() { _ = c.Close() })
	st := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, shared), Timeout: -1})
	if _, err := st.TryBegin(context.Background(), "k", inbox.BeginOptions{}); err != nil {
		t.Fatalf("TryBegin through a live link: %v", err)
	}
	p.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := st.Get(ctx, "k")
	if !errors.Is(err, inbox.ErrStoreUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get through a stalled link: %v, want ErrStoreUnavailable and DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Get through a stalled link returned after %s, want about the caller's 300ms", took)
	}
}
