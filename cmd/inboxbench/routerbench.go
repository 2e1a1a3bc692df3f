package main

import (
	"context"
	"fmt"
	"time"
)

// A group is one broker at one concurrency: the variants of a group are
// compared with the group's baseline of the same repetition.
type group struct {
	broker    string
	consumers int
	variants  []string
	vs        []variant // the variants named by variants
	n         int
}

type routerResults struct {
	groups []group
	// trials[group index][variant][rep]
	trials []map[string][]trialResult
	reps   int
}

// rates returns the throughputs of variant v in group g, one per repetition.
func (r *routerResults) rates(g int, v string) []float64 {
	var out []float64
	for _, t := range r.trials[g][v] {
		out = append(out, t.rate())
	}
	return out
}

// ratios returns v's throughput over the baseline's, per repetition.
func (r *routerResults) ratios(g int, v string) []float64 {
	base := r.trials[g][baseline]
	var out []float64
	for i, t := range r.trials[g][v] {
		if i < len(base) {
			out = append(out, t.rate()/base[i].rate())
		}
	}
	return out
}

func (r *routerResults) cpuPerMsg(g int, v string) []float64 {
	var out []float64
	for _, t := range r.trials[g][v] {
		out = append(out, float64(t.cpuPerMsg())/1e3)
	}
	return out
}

// redisCPUPerMsg returns the Redis server's CPU µs per message of variant v
// in group g, one per repetition; none for a variant that does not use Redis.
func (r *routerResults) redisCPUPerMsg(g int, v string) []float64 {
	var out []float64
	for _, t := range r.trials[g][v] {
		if t.redisMeasured {
			out = append(out, float64(t.redisCPUPerMsg())/1e3)
		}
	}
	return out
}

// batchMeans returns the mean calls per round trip of variant v's store in
// group g, one per repetition; none for a variant whose store does not
// batch.
func (r *routerResults) batchMeans(g int, v string) []float64 {
	var out []float64
	for _, t := range r.trials[g][v] {
		if t.batchMeasured {
			out = append(out, t.batches.Mean())
		}
	}
	return out
}

func (r *routerResults) find(broker string, consumers int) int {
	for i, g := range r.groups {
		if g.broker == broker && g.consumers == consumers {
			return i
		}
	}
	return -1
}

func runRouter(ctx context.Context, o options, logf func(string, ...any)) (*routerResults, error) {
	res := &routerResults{reps: o.reps}
	needs := map[string]bool{}
	for _, b := range o.brokers {
		for _, c := range o.consumers {
			g := group{broker: b, consumers: c, variants: o.scaleVariants, n: o.scaleN}
			if c == 1 {
				g.variants, g.n = o.variants, o.n
			}
			if b == "kafka" {
				g.n = map[bool]int{true: o.kafkaN, false: o.kafkaScaleN}[c == 1]
			}
			var err error
			if g.vs, err = pick(g.variants); err != nil {
				return nil, err
			}
			needsOf(needs, g.vs)
			res.groups = append(res.groups, g)
			res.trials = append(res.trials, map[string][]trialResult{})
		}
	}
	e, err := newEnv(ctx, o, needs)
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.close(cctx); err != nil {
			logf("cleaning up: %v", err)
		}
	}()
	brokers := map[string]broker{}
	defer func() {
		for _, b := range brokers {
			_ = b.close()
		}
	}()
	for _, name := range o.brokers {
		var b broker
		switch name {
		case "rabbitmq":
			b, err = newRabbit(o.amqpURL, o.runID)
		case "kafka":
			b, err = newKafka(o.kafkaBrokers, o.runID)
		default:
			err = fmt.Errorf("unknown broker %q", name)
		}
		if err != nil {
			return nil, err
		}
		brokers[name] = b
	}

	for rep := range o.reps {
		for gi, g := range res.groups {
			for _, v := range rotate(g.vs, rep+gi) {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				started := time.Now()
				t, err := runTrial(ctx, e, brokers[g.broker], v, g.n, g.consumers, o.trialTimeout)
				if err != nil {
					return nil, fmt.Errorf("rep %d: %w", rep+1, err)
				}
				res.trials[gi][v.name] = append(res.trials[gi][v.name], t)
				extra := ""
				if t.redisMeasured {
					extra += fmt.Sprintf("  redis %5.1f µs/msg", float64(t.redisCPUPerMsg())/1e3)
				}
				if t.batchMeasured {
					extra += fmt.Sprintf("  %5.2f calls/round trip", t.batches.Mean())
				}
				logf("rep %d/%d %-8s x%-2d %-21s %7.0f msg/s  cpu %5.1f µs/msg%s  drain %s  trial %s",
					rep+1, o.reps, g.broker, g.consumers, v.name, t.rate(), float64(t.cpuPerMsg())/1e3, extra,
					t.drain.Round(time.Millisecond), time.Since(started).Round(10*time.Millisecond))
			}
		}
	}
	return res, nil
}
