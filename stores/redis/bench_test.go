package redisstore_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
)

// BenchmarkTryBeginComplete measures one message's inbox work, TryBegin then
// Complete on a new key, three ways in one run against the shared Redis:
//
//   - ours: the Store;
//   - raw-lua: the store's commands sent through go-redis by hand (the fast
//     claim's SET NX PX and PEXPIRETIME in one pipeline, then the Complete
//     script), with a fixed lease id and no validation, timeout or reply
//     checks beyond the status: the store's Go-side overhead is
//     ours/raw-lua;
//   - raw-setnx: SET key id NX PX lease, then SET key done PX retention:
//     the floor of two round trips with no lease fencing, history or clock.
//
// Each runs sequentially and with 16 concurrent callers.
func BenchmarkTryBeginComplete(b *testing.B) {
	impls := benchImpls(b, 0)
	var seq atomic.Int64 // unique keys across every sub-benchmark and run
	next := func() string { return strconv.FormatInt(seq.Add(1), 36) }
	ctx := context.Background()
	for _, impl := range impls {
		b.Run(impl.name+"/seq", func(b *testing.B) {
			for b.Loop() {
				if err := impl.op(ctx, next()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(impl.name+"/parallel-16", func(b *testing.B) {
			// RunParallel starts parallelism × GOMAXPROCS goroutines.
			b.SetParallelism((16 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := impl.op(ctx, next()); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkOverhead_paired alternates ours and raw-lua within each
// iteration of each caller (in turn first), so that the load of a shared
// machine, which drifts over seconds, weighs on both alike. It reports each
// one's time per message and their ratio (ours/raw-lua, time: 1.11 or less
// meets the throughput target of 0.9), sequentially and with 16 callers,
// with the store's default Timeout (a timer per call) and with Timeout off.
func BenchmarkOverhead_paired(b *testing.B) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
	}{{"timeout-5s", 0}, {"timeout-off", -1}} {
		for _, callers := range []int{1, 16} {
			mode := "seq"
			if callers > 1 {
				mode = "parallel-" + strconv.Itoa(callers)
			}
			b.Run(tc.name+"/"+mode, func(b *testing.B) {
				impls := benchImpls(b, tc.timeout)
				ours, raw := impls[0], impls[1]
				ctx := context.Background()
				var seq, tOurs, tRaw atomic.Int64
				pair := func() error {
					n := seq.Add(1)
					key := "paired:" + strconv.FormatInt(n, 36)
					first, second, t1, t2 := ours, raw, &tOurs, &tRaw
					if n%2 == 0 {
						first, second, t1, t2 = raw, ours, &tRaw, &tOurs
					}
					start := time.Now()
					if err := first.op(ctx, key); err != nil {
						return err
					}
					mid := time.Now()
					if err := second.op(ctx, key); err != nil {
						return err
					}
					t1.Add(int64(mid.Sub(start)))
					t2.Add(int64(time.Since(mid)))
					return nil
				}
				if callers == 1 {
					for b.Loop() {
						if err := pair(); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := pair(); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				n := float64(seq.Load())
				b.ReportMetric(float64(tOurs.Load())/1e3/n, "ours-µs/msg")
				b.ReportMetric(float64(tRaw.Load())/1e3/n, "raw-lua-µs/msg")
				b.ReportMetric(float64(tOurs.Load())/float64(tRaw.Load()), "ours/raw-lua")
			})
		}
	}
}

type benchImpl struct {
	name string
	op   func(ctx context.Context, key string) error
}

// benchImpls returns ours (with Options.Timeout timeout), raw-lua and
// raw-setnx over the shared Redis, each under a prefix of its own.
func benchImpls(b *testing.B, timeout time.Duration) []benchImpl {
	c := sharedClient(b)
	prefix := testPrefix(b, c)
	const (
		lease     = 30 * time.Second
		retention = 10 * time.Minute // keys expire soon after the run anyway
	)
	st := newStore(b, c, redisstore.Options{Prefix: prefix + "ours:", Retention: retention, Timeout: timeout})
	retUS := strconv.FormatInt(retention.Microseconds(), 10)
	// Physical TTLs in milliseconds, as the store passes them.
	leaseTTLms := (lease + retention).Milliseconds() + 1
	retMS := strconv.FormatInt(retention.Milliseconds(), 10)

	return []benchImpl{
		{"ours", func(ctx context.Context, key string) error {
			cl, err := st.TryBegin(ctx, key, inbox.BeginOptions{Lease: lease})
			if err != nil {
				return err
			}
			if cl.Status != inbox.Acquired {
				b.Fatalf("TryBegin(%q) = %v", key, cl.Status)
			}
			return st.Complete(ctx, key, cl.LeaseID)
		}},
		{"raw-lua", func(ctx context.Context, key string) error {
			k := prefix + "lua:" + key
			p := c.Pipeline()
			set := p.SetNX(ctx, k, redisstore.FreshRecord("lease-id", "", "", lease.Microseconds(), leaseTTLms), time.Duration(leaseTTLms)*time.Millisecond)
			exp := p.PExpireTime(ctx, k)
			if _, err := p.Exec(ctx); err != nil {
				return err
			}
			if !set.Val() || exp.Val() <= 0 {
				b.Fatalf("raw claim of %q: SET NX %v, PEXPIRETIME %v", key, set.Val(), exp.Val())
			}
			n, err := redisstore.OpsScript.Run(ctx, c, []string{k}, retUS, retMS, "C", "lease-id").Int64()
			if err == nil && n != 1 {
				b.Fatalf("raw Complete(%q) = %d", key, n)
			}
			return err
		}},
		{"raw-setnx", func(ctx context.Context, key string) error {
			k := prefix + "setnx:" + key
			ok, err := c.SetNX(ctx, k, "lease-id", lease).Result()
			if err != nil {
				return err
			}
			if !ok {
				b.Fatalf("SET NX %q found the key", k)
			}
			return c.Set(ctx, k, "done", retention).Err()
		}},
	}
}

// BenchmarkTryBeginCompleteInterleaved runs the three implementations of
// BenchmarkTryBeginComplete (ours, raw-lua, raw-setnx) in turn within every
// iteration, the first of them rotating, and reports each one's mean time per
// message and the throughput ratios raw-lua/ours and raw-setnx/ours (time of
// the raw work over ours: 0.9 means ours does 90% of the raw client's
// messages per second). Interleaving makes the load of a shared machine,
// which drifts over seconds, weigh on the three alike. cmd/inboxbench runs
// it.
func BenchmarkTryBeginCompleteInterleaved(b *testing.B) {
	impls := benchImpls(b, 0)
	ctx := context.Background()
	var seq int64
	total := make([]time.Duration, len(impls))
	for b.Loop() {
		seq++
		key := "interleaved:" + strconv.FormatInt(seq, 36)
		for j := range impls {
			k := (int(seq) + j) % len(impls)
			start := time.Now()
			if err := impls[k].op(ctx, key); err != nil {
				b.Fatal(err)
			}
			total[k] += time.Since(start)
		}
	}
	n := float64(seq)
	for i, impl := range impls {
		b.ReportMetric(float64(total[i].Nanoseconds())/n, impl.name+"-ns/msg")
	}
	b.ReportMetric(float64(total[1])/float64(total[0]), "raw-lua/ours")
	b.ReportMetric(float64(total[2])/float64(total[0]), "raw-setnx/ours")
}
