package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox/stores/driver"
)

// trialResult is one router trial: n messages consumed by one variant.
type trialResult struct {
	msgs    int
	elapsed time.Duration // first delivery to last ack
	cpu     time.Duration // this process's CPU time over the same window
	drain   time.Duration // router stop plus the middleware's Close (pending marks)
	// redisCPU is the Redis server's CPU time (INFO cpu: used_cpu_sys +
	// used_cpu_user) from just before the router starts to after the
	// middleware's Close, for variants that use Redis (redisMeasured). It is
	// the whole server's: other clients of a shared Redis count too.
	redisCPU      time.Duration
	redisMeasured bool
	// batches counts the round trips of the variant's store (or floor) and
	// the calls they carried over the same window as redisCPU, for variants
	// whose store batches (batchMeasured).
	batches       driver.BatchStats
	batchMeasured bool
}

func (r trialResult) rate() float64 { return float64(r.msgs) / r.elapsed.Seconds() }

// cpuPerMsg is the harness process's CPU time per message (the consumer,
// the middleware and, for kfake, the broker; not RabbitMQ, Redis or
// PostgreSQL, which run in their own processes).
func (r trialResult) cpuPerMsg() time.Duration { return r.cpu / time.Duration(r.msgs) }

// redisCPUPerMsg is the Redis server's CPU time per message of the trial.
func (r trialResult) redisCPUPerMsg() time.Duration { return r.redisCPU / time.Duration(r.msgs) }

// redisCPUTime is the Redis server's user+system CPU time so far, from INFO
// cpu (microsecond resolution; the main thread and any I/O threads, not
// forked children).
func redisCPUTime(ctx context.Context, c *redis.Client) (time.Duration, error) {
	info, err := c.InfoMap(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO cpu: %w", err)
	}
	var total time.Duration
	for _, field := range []string{"used_cpu_sys", "used_cpu_user"} {
		raw, ok := info["CPU"][field]
		if !ok {
			return 0, fmt.Errorf("redis INFO cpu has no %s", field)
		}
		sec, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return 0, fmt.Errorf("redis INFO cpu %s: %w", field, err)
		}
		total += time.Duration(math.Round(sec*1e6)) * time.Microsecond
	}
	return total, nil
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// meter is the outermost middleware: it notes the first delivery and the
// return of the n-th successful handler, after which the router acks, and
// counts the handlers' errors until then.
type meter struct {
	n           int64
	t0, t1      time.Time
	cpu0, cpu1  time.Duration
	ok, failed  atomic.Int64
	firstErr    atomic.Pointer[error] // the first handler error, for the trial's error
	done        chan struct{}
	startedOnce sync.Once
}

func newMeter(n int) *meter { return &meter{n: int64(n), done: make(chan struct{})} }

func (m *meter) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		m.startedOnce.Do(func() { m.t0, m.cpu0 = time.Now(), cpuTime() })
		select {
		case <-m.done:
			// The trial is over and the router closing: a delivery now is
			// the last message again, nacked by the closing subscriber
			// before its ack went out (watermill-amqp picks at random
			// between the ack and the close), with a context that ends at
			// once. Not the trial's work, nor its error.
			return h(msg)
		default:
		}
		out, err := h(msg)
		if err != nil {
			m.failed.Add(1)
			m.firstErr.CompareAndSwap(nil, &err)
			return out, err
		}
		if m.ok.Add(1) == m.n {
			m.t1, m.cpu1 = time.Now(), cpuTime()
			close(m.done)
		}
		return out, nil
	}
}

func handle(*message.Message) error { return nil }

// runTrial consumes a new queue or topic of n messages with consumers
// concurrent consumers through variant v.
func runTrial(ctx context.Context, e *env, b broker, v variant, n, consumers int, timeout time.Duration) (trialResult, error) {
	ts, err := b.prepare(ctx, trialSpec{n: n, consumers: consumers})
	if err != nil {
		return trialResult{}, err
	}
	defer ts.cleanup()
	mw, closeMW, err := v.make(e, b.name(), ts.group)
	if err != nil {
		return trialResult{}, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return trialResult{}, err
	}
	var redis0 time.Duration
	measureRedis := v.usesRedis() && e.redis != nil
	if measureRedis {
		if redis0, err = redisCPUTime(ctx, e.redis); err != nil {
			_ = closeMW(context.Background())
			return trialResult{}, err
		}
	}
	var counter batchCounter
	var batch0 driver.BatchStats
	if v.batches != nil {
		if counter = v.batches(e); counter != nil {
			batch0 = counter.BatchStats()
		}
	}
	m := newMeter(n)
	router.AddMiddleware(m.middleware, mw)
	for i, sub := range ts.subs {
		router.AddConsumerHandler("consumer-"+strconv.Itoa(i), ts.topic, sub, handle)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	routerDone := make(chan error, 1)
	// Goroutines the router starts carry these labels in CPU profiles
	// (-cpuprofile; go tool pprof -tagfocus variant=inbox-redis).
	go pprof.Do(runCtx, pprof.Labels("variant", v.name, "broker", b.name()), func(ctx context.Context) { routerDone <- router.Run(ctx) })

	var waitErr error
	t := time.NewTimer(timeout)
	select {
	case <-m.done:
	case <-t.C:
		waitErr = fmt.Errorf("%s/%s: %d of %d messages handled (%d handler errors) within %s", b.name(), v.name, m.ok.Load(), n, m.failed.Load(), timeout)
	case err := <-routerDone:
		waitErr = fmt.Errorf("%s/%s: router stopped early: %v", b.name(), v.name, err)
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	t.Stop()
	stop := time.Now()
	closeErr := router.Close()
	closeErr = errors.Join(closeErr, closeMW(context.Background()))
	res := trialResult{msgs: n, elapsed: m.t1.Sub(m.t0), cpu: m.cpu1 - m.cpu0, drain: time.Since(stop)}
	if measureRedis && waitErr == nil && closeErr == nil {
		redis1, err := redisCPUTime(ctx, e.redis)
		if err != nil {
			return res, err
		}
		res.redisCPU, res.redisMeasured = redis1-redis0, true
	}
	if counter != nil && waitErr == nil && closeErr == nil {
		res.batches, res.batchMeasured = counter.BatchStats().Sub(batch0), true
	}
	if err := errors.Join(waitErr, closeErr); err != nil {
		return res, err
	}
	if f := m.failed.Load(); f > 0 {
		return res, fmt.Errorf("%s/%s: %d handler errors, the first: %w", b.name(), v.name, f, *m.firstErr.Load())
	}
	return res, nil
}
