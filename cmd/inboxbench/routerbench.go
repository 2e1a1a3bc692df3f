package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"
)

// A group is one broker at one concurrency and one store round-trip time:
// the variants of a group are compared with the group's baseline of the
// same repetition.
type group struct {
	broker    string
	consumers int
	rtt       time.Duration // -store-rtt; 0 is loopback
	variants  []string
	vs        []variant // the variants named by variants
	n         int
}

type routerResults struct {
	groups []group
	// trials[group index][variant][rep]
	trials []map[string][]trialResult
	reps   int
	// rtts are the store round-trip times of the groups, in the order of
	// -store-rtt; probes[rtt], the round trips to the stores measured at
	// that time before the first trial.
	rtts   []time.Duration
	probes map[time.Duration][]probe
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

func (r *routerResults) find(broker string, consumers int, rtt time.Duration) int {
	for i, g := range r.groups {
		if g.broker == broker && g.consumers == consumers && g.rtt == rtt {
			return i
		}
	}
	return -1
}

func runRouter(ctx context.Context, o options, logf func(string, ...any)) (*routerResults, error) {
	res := &routerResults{reps: o.reps, probes: map[time.Duration][]probe{}}
	needs := map[time.Duration]map[string]bool{}
	for _, rtt := range o.storeRTTs {
		for _, b := range o.brokers {
			for _, c := range o.consumers {
				g := group{broker: b, consumers: c, rtt: rtt, variants: o.scaleVariants, n: o.scaleN}
				if c == 1 {
					g.variants, g.n = o.variants, o.n
				}
				if b == "kafka" {
					g.n = map[bool]int{true: o.kafkaN, false: o.kafkaScaleN}[c == 1]
				}
				vs, err := pick(g.variants)
				if err != nil {
					return nil, err
				}
				if rtt > 0 {
					// At a distance, only what reaches a store over a
					// socket, and the baseline; nothing else to compare,
					// no group.
					g.variants = nil
					for _, v := range vs {
						if v.name == baseline || v.networked() {
							g.vs, g.variants = append(g.vs, v), append(g.variants, v.name)
						}
					}
					if len(g.vs) < 2 {
						continue
					}
				} else {
					g.vs = vs
				}
				if needs[rtt] == nil {
					needs[rtt] = map[string]bool{}
					res.rtts = append(res.rtts, rtt)
				}
				needsOf(needs[rtt], g.vs)
				res.groups = append(res.groups, g)
				res.trials = append(res.trials, map[string][]trialResult{})
			}
		}
	}
	envs := map[time.Duration]*env{}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, e := range envs {
			if err := e.close(cctx); err != nil {
				logf("cleaning up: %v", err)
			}
		}
	}()
	for _, rtt := range res.rtts {
		e, err := newEnv(ctx, o, needs[rtt], rtt)
		if err != nil {
			return nil, err
		}
		envs[rtt] = e
		if res.probes[rtt], err = probeRoundTrips(ctx, e); err != nil {
			return nil, err
		}
		for _, p := range res.probes[rtt] {
			logf("store round-trip time %s: %s median %.0f µs [%.0f, %.0f] over %d", rtt, p.what, p.median, p.lo, p.hi, p.n)
		}
	}
	brokers := map[string]broker{}
	defer func() {
		for _, b := range brokers {
			_ = b.close()
		}
	}()
	for _, name := range o.brokers {
		var b broker
		var err error
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
				t, err := runTrial(ctx, envs[g.rtt], brokers[g.broker], v, g.n, g.consumers, o.trialTimeout)
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
				logf("rep %d/%d %-8s x%-2d rtt %-6s %-21s %7.0f msg/s  cpu %5.1f µs/msg%s  drain %s  trial %s",
					rep+1, o.reps, g.broker, g.consumers, g.rtt, v.name, t.rate(), float64(t.cpuPerMsg())/1e3, extra,
					t.drain.Round(time.Millisecond), time.Since(started).Round(10*time.Millisecond))
			}
		}
	}
	return res, nil
}

// A probe is the time of a store's simplest round trip, measured from this
// process through the env's connections (through the proxy at a store
// round-trip time): what a round trip to the store cost in this run.
type probe struct {
	what   string // "Redis PING"
	n      int
	median float64 // µs
	lo, hi float64 // the 10th and 90th percentiles, µs
}

// probeRoundTrips times the simplest round trip of each store of e, one at
// a time: Redis PING, PostgreSQL and MariaDB SELECT 1.
func probeRoundTrips(ctx context.Context, e *env) ([]probe, error) {
	var out []probe
	timed := func(what string, n int, call func() error) error {
		ds := make([]float64, 0, n)
		for range n {
			t0 := time.Now()
			if err := call(); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			ds = append(ds, float64(time.Since(t0).Nanoseconds())/1e3)
		}
		slices.Sort(ds)
		out = append(out, probe{what: what, n: n, median: median(ds), lo: ds[n/10], hi: ds[n*9/10]})
		return nil
	}
	if e.redis != nil {
		if err := timed("Redis PING", 400, func() error { return e.redis.Ping(ctx).Err() }); err != nil {
			return nil, err
		}
	}
	for _, db := range []struct {
		what string
		db   *sql.DB
	}{{"PostgreSQL SELECT 1", e.pg}, {"MariaDB SELECT 1", e.my}} {
		if db.db == nil {
			continue
		}
		var one int
		if err := timed(db.what, 200, func() error { return db.db.QueryRowContext(ctx, "SELECT 1").Scan(&one) }); err != nil {
			return nil, err
		}
	}
	return out, nil
}
