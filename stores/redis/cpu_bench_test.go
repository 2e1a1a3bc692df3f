package redisstore_test

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
)

// redisCPU is the server's used_cpu_sys + used_cpu_user, in microseconds.
func redisCPU(tb testing.TB, c *redis.Client) float64 {
	tb.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var us float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatal(err)
			}
			us += f * 1e6
		}
	}
	return us
}

// redisCmdUsec is the sum of usec over INFO commandstats: the time Redis
// spent running commands (scripts included), without reading, parsing and
// replying.
func redisCmdUsec(tb testing.TB, c *redis.Client) float64 {
	tb.Helper()
	var us float64
	for _, st := range commandStats(tb, c) {
		us += st.usec
	}
	return us
}

type cmdStat struct{ calls, usec float64 }

// commandStats is INFO commandstats by command name.
func commandStats(tb testing.TB, c *redis.Client) map[string]cmdStat {
	tb.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	m := map[string]cmdStat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st cmdStat
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			x, err := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				st.calls = x
			case "usec":
				st.usec = x
			default:
				continue
			}
			if err != nil {
				tb.Fatal(err)
			}
		}
		m[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return m
}

// roundTrips is a go-redis hook that counts round trips: commands sent
// alone and pipelines.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// BenchmarkRedisCPU_message measures what one message costs a Redis server
// of its own (redistest; no other client, so its CPU is this benchmark's):
// the inbox's work for a new key, TryBegin then Complete, through the
// store ("store"), and the same with the middleware's Complete, which
// carries its claim and takes the script's short way ("store-mark"); Watermill's Deduplicator over Redis, one SET NX PX per
// message through [redisstore.ExpiringKeyRepository] ("dedup"); and a bare
// SET NX PX ("floor-setnx", what floor-redis of cmd/inboxbench sends).
// Each runs with one caller and with 16 concurrent ones, whose calls the
// store batches. Metrics, per message: the server's CPU time (INFO cpu),
// the time of its script calls (usec of EVALSHA and EVAL in INFO
// commandstats, the commands they call included), and the client's round
// trips (commands sent alone and pipelines, counted by a hook).
func BenchmarkRedisCPU_message(b *testing.B) {
	srv := redistest.Start(b, redistest.Config{})
	o := &redis.Options{Addr: srv.Addr(), Protocol: 2, PoolSize: 64, ContextTimeoutEnabled: true}
	info := redis.NewClient(o) // INFO only, not counted
	b.Cleanup(func() { _ = info.Close() })
	c := redis.NewClient(o)
	b.Cleanup(func() { _ = c.Close() })
	var rt roundTrips
	c.AddHook(&rt)
	s := newStore(b, c, redisstore.Options{Prefix: "store:", Retention: 10 * time.Minute})
	dedup, err := redisstore.NewExpiringKeyRepository(c, redisstore.ExpiringKeyRepositoryOptions{Prefix: "dedup:", Window: 10 * time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var seq atomic.Int64 // unique keys across every sub-benchmark and run
	for _, tc := range []struct {
		name string
		msg  func(key string) error
	}{
		{"store", func(key string) error {
			cl, err := s.TryBegin(ctx, key, inbox.BeginOptions{})
			if err != nil || cl.Status != inbox.Acquired {
				b.Errorf("TryBegin = %+v, %v", cl, err)
				return err
			}
			return s.Complete(ctx, key, cl.LeaseID)
		}},
		{"store-mark", func(key string) error {
			// The middleware's mark: a Complete that carries its claim
			// (the script's short way, K).
			cl, err := s.TryBegin(ctx, key, inbox.BeginOptions{Lease: 30 * time.Second})
			if err != nil || cl.Status != inbox.Acquired {
				b.Errorf("TryBegin = %+v, %v", cl, err)
				return err
			}
			done := make(chan error, 1)
			s.Go(ctx, driver.Op{Kind: driver.Complete, Key: key, LeaseID: cl.LeaseID, Lease: 30 * time.Second, ExpiresAt: cl.ExpiresAt},
				func(_ inbox.Claim, err error) { done <- err })
			return <-done
		}},
		{"dedup", func(key string) error {
			dup, err := dedup.IsDuplicate(ctx, key)
			if dup {
				b.Errorf("IsDuplicate(%q) = true", key)
			}
			return err
		}},
		{"floor-setnx", func(key string) error {
			ok, err := c.SetNX(ctx, "floor:"+key, "1", 30*time.Second).Result()
			if !ok && err == nil {
				b.Errorf("SET NX found %q", key)
			}
			return err
		}},
	} {
		for _, callers := range []int{1, 16} {
			mode := "seq"
			if callers > 1 {
				mode = "parallel-" + strconv.Itoa(callers)
			}
			b.Run(tc.name+"/"+mode, func(b *testing.B) {
				cpu, cmds, trips := redisCPU(b, info), commandStats(b, info), rt.n.Load()
				var n atomic.Int64
				one := func() error {
					n.Add(1)
					return tc.msg(strconv.FormatInt(seq.Add(1), 36))
				}
				if callers == 1 {
					for b.Loop() {
						if err := one(); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := one(); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				after := commandStats(b, info)
				msgs := float64(n.Load())
				var scriptUS float64
				for _, name := range []string{"evalsha", "eval"} {
					scriptUS += after[name].usec - cmds[name].usec
				}
				b.ReportMetric((redisCPU(b, info)-cpu)/msgs, "redis-cpu-µs/msg")
				b.ReportMetric(scriptUS/msgs, "redis-script-µs/msg")
				b.ReportMetric(float64(rt.n.Load()-trips)/msgs, "round-trips/msg")
			})
		}
	}
}

// BenchmarkRedisCPU_TryBegin_new_key measures what a TryBegin of a key
// Redis does not hold costs the Redis server: the delta of INFO cpu
// (used_cpu_sys + used_cpu_user) over the run, divided by the claims
// (metric redis-cpu-µs/claim); and the time Redis spent in the commands
// themselves, the sum of usec of INFO commandstats (redis-cmd-µs/claim).
// One caller: the round trip's system calls on Redis's side are part of
// the first. The shared Redis serves other clients meanwhile, whose work
// is counted too: compare runs made together. floor-setnx is a bare SET
// NX PX of a short value, for comparison.
func BenchmarkRedisCPU_TryBegin_new_key(b *testing.B) {
	c := sharedClient(b)
	prefix := testPrefix(b, c)
	s := newStore(b, c, redisstore.Options{Prefix: prefix, Timeout: -1})
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		claim func(key string)
	}{
		{"store", func(key string) {
			cl, err := s.TryBegin(ctx, key, inbox.BeginOptions{})
			if err != nil || cl.Status != inbox.Acquired {
				b.Fatalf("TryBegin = %+v, %v", cl, err)
			}
		}},
		{"floor-setnx", func(key string) {
			if ok, err := c.SetNX(ctx, prefix+"floor:"+key, "lease-id", 30*time.Second).Result(); err != nil || !ok {
				b.Fatalf("SET NX = %v, %v", ok, err)
			}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cpu, cmd := redisCPU(b, c), redisCmdUsec(b, c)
			n := 0
			for b.Loop() {
				n++
				tc.claim(tc.name + ":" + strconv.Itoa(n))
			}
			b.ReportMetric((redisCPU(b, c)-cpu)/float64(n), "redis-cpu-µs/claim")
			// Minus the INFO of the first reading, a few µs in all.
			b.ReportMetric((redisCmdUsec(b, c)-cmd)/float64(n), "redis-cmd-µs/claim")
		})
	}
}
