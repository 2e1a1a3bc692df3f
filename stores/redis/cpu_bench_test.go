package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

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

// BenchmarkRedisCPU_TryBegin_new_key measures what a TryBegin of a key
// Redis does not hold costs the Redis server: the delta of INFO cpu
// (used_cpu_sys + used_cpu_user) over the run, divided by the claims
// (metric redis-cpu-µs/claim). One caller: the round trip's system calls
// on Redis's side are part of it. The shared Redis serves other clients
// meanwhile, whose work is counted too: compare runs made together.
func BenchmarkRedisCPU_TryBegin_new_key(b *testing.B) {
	c := sharedClient(b)
	s := newStore(b, c, redisstore.Options{Prefix: testPrefix(b, c), Timeout: -1})
	ctx := context.Background()
	before := redisCPU(b, c)
	n := 0
	for b.Loop() {
		n++
		cl, err := s.TryBegin(ctx, strconv.Itoa(n), inbox.BeginOptions{})
		if err != nil || cl.Status != inbox.Acquired {
			b.Fatalf("TryBegin = %+v, %v", cl, err)
		}
	}
	b.ReportMetric((redisCPU(b, c)-before)/float64(n), "redis-cpu-µs/claim")
}
