package main

import (
	"context"
	"runtime"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
)

// microResult is one repetition of one contender of the micro benchmark.
type microResult struct {
	cpuNs  float64 // process CPU time per message (all goroutines, GC included)
	allocs float64 // heap allocations per message
	bytes  float64 // heap bytes allocated per message
}

type microResults struct {
	n        int
	yield    bool
	variants []string
	runs     map[string][]microResult
}

// runMicro calls each contender's wrapped handler as the router does
// (handler, then Ack, each message with a cancelable context of its own, as
// subscribers give them) for o.microN distinct messages per repetition, without
// a broker: the middleware's own cost. The inbox's marks land after the ack
// in a goroutine; its Close, which waits for them, is inside the measurement.
// Every contender builds its messages, so the overhead of a contender is its
// cost minus none's. This is BenchmarkMiddleware of package middleware, run
// with rotation and medians, and with a distinct payload per message.
func runMicro(ctx context.Context, o options, logf func(string, ...any)) (*microResults, error) {
	vs, err := pick(o.microVariants)
	if err != nil {
		return nil, err
	}
	needs := map[string]bool{}
	needsOf(needs, vs)
	e, err := newEnv(ctx, o, needs, 0)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := e.close(context.Background()); err != nil {
			logf("cleaning up: %v", err)
		}
	}()
	res := &microResults{n: o.microN, variants: o.microVariants, yield: o.microYield, runs: map[string][]microResult{}}
	for rep := range o.reps {
		for _, v := range rotate(vs, rep) {
			mw, closeFn, err := v.make(e, "bench", "micro-"+strconv.Itoa(rep))
			if err != nil {
				return nil, err
			}
			h := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
			runtime.GC()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			cpu0 := cpuTime()
			for i := range o.microN {
				id := strconv.Itoa(i)
				// Distinct payloads: the Deduplicator keys by a payload hash.
				m := message.NewMessage(id, []byte(`{"amount_cents":1999,"order":`+id+`}`))
				// Each message gets a context of its own, canceled once it is
				// acked, as watermill-amqp and watermill-kafka give them.
				mctx, cancel := context.WithCancel(ctx)
				m.SetContext(mctx)
				if _, err := h(m); err != nil {
					cancel()
					return nil, err
				}
				m.Ack()
				cancel()
				if o.microYield {
					runtime.Gosched()
				}
			}
			if err := closeFn(ctx); err != nil {
				return nil, err
			}
			cpu := cpuTime() - cpu0
			runtime.ReadMemStats(&m1)
			n := float64(o.microN)
			r := microResult{
				cpuNs:  float64(cpu.Nanoseconds()) / n,
				allocs: float64(m1.Mallocs-m0.Mallocs) / n,
				bytes:  float64(m1.TotalAlloc-m0.TotalAlloc) / n,
			}
			res.runs[v.name] = append(res.runs[v.name], r)
			logf("rep %d/%d micro %-20s %6.0f cpu-ns/msg %5.1f allocs/msg %7.0f B/msg", rep+1, o.reps, v.name, r.cpuNs, r.allocs, r.bytes)
		}
	}
	runtime.GC() // let the stores' records go before the next section
	return res, nil
}

func (r *microResults) col(v string, f func(microResult) float64) []float64 {
	var out []float64
	for _, m := range r.runs[v] {
		out = append(out, f(m))
	}
	return out
}

// overhead returns v's CPU time per message minus the baseline's, per
// repetition.
func (r *microResults) overhead(v string) []float64 {
	base := r.runs[baseline]
	var out []float64
	for i, m := range r.runs[v] {
		if i < len(base) {
			out = append(out, m.cpuNs-base[i].cpuNs)
		}
	}
	return out
}
