package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
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
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var us float64
	for _, line := range strings.Split(info, "\n") {
		_, v, ok := strings.Cut(strings.TrimSpace(line), "usec=")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		v, _, _ = strings.Cut(v, ",")
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			tb.Fatal(err)
		}
		us += f
	}
	return us
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
