package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox/stores"
)

type report struct {
	opts               options
	machine            []string
	started, finished  time.Time
	loadStart, loadEnd string

	micro     *microResults
	router    *routerResults
	failures  *failuresResults
	order     *orderResults
	roundtrip *rtResults
	sizing    *sizingResults
}

// loadAvg returns the 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// describeMachine lists the CPU, memory, Go and service versions.
func describeMachine(ctx context.Context, o options) []string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out []string
	cpu := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	out = append(out, fmt.Sprintf("CPU: %d cores (GOMAXPROCS %d), %s", runtime.NumCPU(), runtime.GOMAXPROCS(0), cpu))
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "MemTotal:") {
				out = append(out, "Memory: "+strings.Join(strings.Fields(l)[1:], " "))
				break
			}
		}
	}
	out = append(out, fmt.Sprintf("Go: %s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH))
	if bi, ok := debug.ReadBuildInfo(); ok {
		var mods []string
		for _, d := range bi.Deps {
			for _, p := range []string{"watermill", "watermill-amqp", "watermill-kafka", "sarama", "kfake", "go-redis", "pgx", "mysql", "sqlite"} {
				if strings.HasSuffix(strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(d.Path, "/v2"), "/v3"), "/v5"), "/"+p) ||
					strings.HasSuffix(strings.TrimSuffix(d.Path, "/v9"), "/"+p) || strings.HasSuffix(d.Path, "/pkg/"+p) {
					mods = append(mods, d.Path+" "+d.Version)
				}
			}
		}
		if len(mods) > 0 {
			out = append(out, "Modules: "+strings.Join(mods, ", "))
		}
	}
	var services []string
	if o.has("router") || o.has("failures") || o.has("order") || o.has("roundtrip") || o.has("sizing") {
		if ro, err := redis.ParseURL(o.redisURL); err == nil {
			c := redis.NewClient(ro)
			if info, err := c.InfoMap(ctx, "server").Result(); err == nil {
				services = append(services, "Redis "+info["Server"]["redis_version"])
			}
			_ = c.Close()
		}
		if db, err := sql.Open("pgx", o.postgresURL); err == nil {
			var v string
			if db.QueryRowContext(ctx, "SHOW server_version").Scan(&v) == nil {
				services = append(services, "PostgreSQL "+v)
			}
			_ = db.Close()
		}
		if cfg, err := mysqlConfig(o.mysqlURL); err == nil {
			if conn, err := mysql.NewConnector(cfg); err == nil {
				db := sql.OpenDB(conn)
				var v string
				if db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v) == nil {
					services = append(services, "MariaDB/MySQL "+v)
				}
				_ = db.Close()
			}
		}
		if db, err := sql.Open("sqlite", ":memory:"); err == nil {
			var v string
			if db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&v) == nil {
				services = append(services, "SQLite "+v+" (modernc.org/sqlite, WAL, synchronous=NORMAL)")
			}
			_ = db.Close()
		}
	}
	if o.has("router") || o.has("failures") || o.has("order") {
		if c, err := amqp091.Dial(o.amqpURL); err == nil {
			if v, ok := c.Properties["version"].(string); ok {
				services = append(services, "RabbitMQ "+v)
			}
			_ = c.Close()
		}
		if len(o.kafkaBrokers) == 0 {
			services = append(services, "Kafka: kfake in this process")
		}
	}
	if len(services) > 0 {
		out = append(out, "Services: "+strings.Join(services, "; "))
	}
	return out
}

// repetitions says over how many repetitions the figures are medians: the
// failures section has its own count (-failures-reps).
func (r *report) repetitions() string {
	reps := repetitions(r.opts.reps)
	if r.failures != nil && r.failures.reps != r.opts.reps {
		reps += fmt.Sprintf(" (%s in the failures section, -failures-reps)", repetitions(r.failures.reps))
	}
	if r.order != nil && r.order.reps != r.opts.reps {
		reps += fmt.Sprintf(" (%s in the order section, -order-reps)", repetitions(r.order.reps))
	}
	return reps
}

func (r *report) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# inboxbench results\n\n")
	p("Run `%s`, %s, %s.\n", r.opts.runID, r.started.UTC().Format("2006-01-02 15:04 MST"), r.finished.Sub(r.started).Round(time.Second))
	p("Load average (1, 5, 15 min): %s at the start, %s at the end.\n\n", r.loadStart, r.loadEnd)
	for _, m := range r.machine {
		p("- %s\n", m)
	}
	p("\nCommand: `inboxbench %s`\n\n", strings.Join(redactArgs(r.opts.args), " "))
	p("Every figure is the median over %s; each repetition runs every variant once, in an order rotated from one repetition to the next. Ratios are taken within a repetition (against the baseline run in the same repetition), then their median is given, with the range over repetitions in brackets.\n\n", r.repetitions())
	if r.router != nil {
		r.router.markdown(&b)
	}
	if r.failures != nil {
		r.failures.markdown(&b)
	}
	if r.order != nil {
		r.order.markdown(&b)
	}
	if r.micro != nil {
		r.micro.markdown(&b)
	}
	if r.roundtrip != nil {
		r.roundtrip.markdown(&b)
	}
	if r.sizing != nil {
		r.sizing.markdown(&b)
	}
	p("## Targets\n\n")
	p("Ratios taken within each repetition, median [range] over the repetitions; a target is met when the median meets it.\n\n")
	r.targetsTable(&b)
	p("\n")
	return b.String()
}

func rangeOf(xs []float64, format string) string {
	lo, hi := spread(xs)
	return fmt.Sprintf("["+format+", "+format+"]", lo, hi)
}

// distance is how the headings name the store round-trip time rtt: nothing
// for loopback.
func distance(rtt time.Duration) string {
	if rtt <= 0 {
		return ""
	}
	return ", store " + rtt.String() + " away"
}

func (r *routerResults) markdown(b *strings.Builder) {
	for i, rtt := range r.rtts {
		r.markdownAt(b, rtt, i == 0)
	}
}

// markdownAt writes the tables of the groups at store round-trip time rtt;
// the first tables written say what their columns are.
func (r *routerResults) markdownAt(b *strings.Builder, rtt time.Duration, first bool) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## Router throughput, one consumer%s\n\n", distance(rtt))
	if first {
		p("Messages per second from the first delivery to the last ack, a no-op handler, distinct message ids. ")
		p("RabbitMQ: watermill-amqp's durable-queue defaults (persistent messages, prefetch 1). Kafka: watermill-kafka, one consumer-group member on a one-partition topic. ")
		p("CPU is this process's CPU time per message over the same window (consumer and middleware, and for kfake the broker too; not RabbitMQ, Redis or PostgreSQL). ")
		p("Redis CPU, for the variants that use Redis, is the Redis server's CPU time (`INFO cpu`: used_cpu_sys + used_cpu_user) from just before the router starts to after the middleware has drained, divided by the messages of the trial: the whole server's, so other clients of a shared Redis and its own background work count too. ")
		p("Calls per round trip, for the variants whose store batches, is the mean number of store calls that one round trip carried (`BatchStats` of the store before and after the trial, drain included: calls over round trips); for the remote store, the round trips of inboxd's Redis store, as the remote client sends one HTTP request per call. ")
		p("floor-redis claims each message with a bare `SET key 1 NX PX <lease>`, sent through the stores' group commit with the Redis store's bounds (one pipeline per batch), and writes nothing after the handler: the least any claim on Redis can cost. ")
		p("floor2-redis also marks each message after the ack, with a bare `SET key 2 PX <retention>` through the same group commit, and floor2-postgres does both on PostgreSQL (an `INSERT ... ON CONFLICT DO NOTHING` of a leased row, an `UPDATE` of it after the ack, on a table with the store's columns; a batch is one statement, with the SQL store's bounds): the least any inbox, which must claim before the handler and mark after it, can cost. floor2f-redis fences that mark as the inbox must: its claim sets a lease id of its own (`SET key <lease-id> NX PX <lease>`) and its mark is the smallest script that marks the key only while it holds that id (GET, compare, SET): what fencing itself costs on Redis. store-redis is the inbox's own Redis store under the floors' shallow middleware: its claim (`TryBegin` with a lease id) before the handler, its mark (the `Complete` the middleware sends, carrying what the claim wrote) after the ack, with no key building, lease keeping, handler context, metrics or logs; between floor2f-redis and it lies what the store's record and claim cost, between it and inbox-redis what the middleware's own path costs.\n\n")
	} else {
		p("The columns are those of the first tables of this report.\n\n")
	}
	if rtt > 0 {
		p("Every connection of this process to Redis, PostgreSQL and MariaDB (the stores', the Deduplicator's, the floors', and inboxd's Redis for the remote store; not inboxd's HTTP) went through a proxy in this process that holds the server's replies for %s (internal/faultproxy's `DelayReplies`), so that each round trip takes that much longer, as across a network: the store is %s away. ", rtt, rtt)
		p("Only the variants that reach such a store ran, with none as the baseline. The proxy's own work (two more socket reads and writes per round trip, and the wake-ups of its goroutines) counts in this process's CPU per message.\n\n")
	}
	if probes := r.probes[rtt]; len(probes) > 0 {
		p("Round trips measured before the first trial (one at a time; median [10th, 90th percentile]):")
		for i, pr := range probes {
			p("%s %s %.0f µs [%.0f, %.0f]", map[bool]string{true: "", false: ";"}[i == 0], pr.what, pr.median, pr.lo, pr.hi)
		}
		p(".\n\n")
	}
	for gi, g := range r.groups {
		if g.consumers != 1 || g.rtt != rtt {
			continue
		}
		p("### %s (%d messages per trial)\n\n", g.broker, g.n)
		p("| variant | msg/s | ratio to none | CPU µs/msg | Redis CPU µs/msg | calls/round trip |\n|---|--:|--:|--:|--:|--:|\n")
		for _, v := range g.variants {
			rates, ratios, cpu := r.rates(gi, v), r.ratios(gi, v), r.cpuPerMsg(gi, v)
			p("| %s | %.0f %s | %.2f %s | %.1f | %s | %s |\n", v, median(rates), rangeOf(rates, "%.0f"), median(ratios), rangeOf(ratios, "%.2f"), median(cpu),
				cell(r.redisCPUPerMsg(gi, v), "%.1f", true), cell(r.batchMeans(gi, v), "%.2f", true))
		}
		p("\n")
	}
	var scaling []int
	for _, g := range r.groups {
		if g.consumers != 1 && g.rtt == rtt {
			scaling = append(scaling, g.consumers)
		}
	}
	if len(scaling) == 0 {
		return
	}
	p("## Scaling with concurrent consumers%s\n\n", distance(rtt))
	if first {
		p("RabbitMQ: that many competing consumers (router handlers, each its own channel with prefetch 1) on one queue. Kafka: one consumer-group member on a topic with that many partitions (watermill-kafka handles the partitions concurrently, one message at a time each). Cells: msg/s (ratio to none at the same concurrency); then, for the variants that use Redis, the Redis server's CPU µs per message at each concurrency (the whole server's, as above); then, for the variants whose store batches, the mean calls per round trip at each concurrency (as above).\n\n")
	} else {
		p("The cells are those of the first scaling tables of this report.\n\n")
	}
	for _, broker := range r.brokers() {
		var cols []int
		for _, g := range r.groups {
			if g.broker == broker && g.rtt == rtt {
				cols = append(cols, g.consumers)
			}
		}
		var rows []string
		for _, g := range r.groups {
			if g.broker == broker && g.consumers != 1 && g.rtt == rtt {
				rows = g.variants
				break
			}
		}
		if len(rows) == 0 {
			continue
		}
		// Extra column groups, one column per concurrency each, shown when
		// some row has a figure.
		extras := []struct {
			title  string
			format string
			of     func(g int, v string) []float64
		}{
			{"Redis CPU µs/msg", "%.1f", r.redisCPUPerMsg},
			{"calls/round trip", "%.2f", r.batchMeans},
		}
		shown := make([]bool, len(extras))
		for i, x := range extras {
			for _, c := range cols {
				for _, v := range rows {
					if len(x.of(r.find(broker, c, rtt), v)) > 0 {
						shown[i] = true
					}
				}
			}
		}
		plural := func(c int) string { return map[bool]string{true: "", false: "s"}[c == 1] }
		p("### %s\n\n| variant |", broker)
		for _, c := range cols {
			p(" %d consumer%s |", c, plural(c))
		}
		for i, x := range extras {
			if shown[i] {
				for _, c := range cols {
					p(" %s, %d consumer%s |", x.title, c, plural(c))
				}
			}
		}
		p("\n|---|")
		for range cols {
			p("--:|")
		}
		for i := range extras {
			if shown[i] {
				for range cols {
					p("--:|")
				}
			}
		}
		p("\n")
		for _, v := range rows {
			p("| %s |", v)
			for _, c := range cols {
				gi := r.find(broker, c, rtt)
				if _, ok := r.trials[gi][v]; !ok {
					p(" |")
					continue
				}
				p(" %.0f (%.2f) |", median(r.rates(gi, v)), median(r.ratios(gi, v)))
			}
			for i, x := range extras {
				if shown[i] {
					for _, c := range cols {
						p(" %s |", cell(x.of(r.find(broker, c, rtt), v), x.format, false))
					}
				}
			}
			p("\n")
		}
		p("\n")
	}
}

// cell is the median of xs in format, with their range when withRange;
// empty for none (a variant that does not use Redis, or whose store does not
// batch).
func cell(xs []float64, format string, withRange bool) string {
	if len(xs) == 0 {
		return ""
	}
	if withRange {
		return fmt.Sprintf(format+" %s", median(xs), rangeOf(xs, format))
	}
	return fmt.Sprintf(format, median(xs))
}

func (r *routerResults) brokers() []string {
	var out []string
	for _, g := range r.groups {
		if !slices.Contains(out, g.broker) {
			out = append(out, g.broker)
		}
	}
	return out
}

func (m *microResults) markdown(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## Middleware cost per message, memory store, no broker\n\n")
	p("The wrapped handler called as the router calls it (handler, then ack) for %d distinct messages per repetition, each with a cancelable context of its own, canceled after the ack, as subscribers give them; the inbox's marks, which land after the ack, are drained inside the measurement. CPU time is the process's (all goroutines, GC included) per message; overhead is a contender's CPU time minus none's in the same repetition.\n\n", m.n)
	if m.yield {
		p("Each message was followed by runtime.Gosched() (-micro-yield).\n\n")
	}
	p("| contender | CPU ns/msg | overhead ns/msg | allocs/msg | bytes/msg |\n|---|--:|--:|--:|--:|\n")
	for _, v := range m.variants {
		cpu := m.col(v, func(r microResult) float64 { return r.cpuNs })
		over := m.overhead(v)
		p("| %s | %.0f %s | %.0f %s | %.1f | %.0f |\n", v, median(cpu), rangeOf(cpu, "%.0f"), median(over), rangeOf(over, "%.0f"),
			median(m.col(v, func(r microResult) float64 { return r.allocs })), median(m.col(v, func(r microResult) float64 { return r.bytes })))
	}
	p("\n")
}

func (r *rtResults) markdown(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## Store round trips: TryBegin + Complete of a new key\n\n")
	p("One client, sequential calls, the variants interleaved within every iteration (the stores' BenchmarkTryBeginCompleteInterleaved and BenchmarkClaimCompleteInterleaved). Ratios are throughputs relative to the raw work: the raw work's time over ours (1.00: as fast as the raw client; below 1: ours is slower).\n\n")
	p("| store | iterations | ours µs/msg | raw client, same work | µs/msg | ours ÷ raw (throughput) | least equivalent raw work | µs/msg | ours ÷ floor |\n|---|--:|--:|---|--:|--:|---|--:|--:|\n")
	for _, s := range r.stores {
		rows := r.runs[s]
		same := r.col(s, func(x rtRow) float64 { return x.sameRatio })
		floor := r.col(s, func(x rtRow) float64 { return x.floorRatio })
		p("| %s | %d | %.1f | %s | %.1f | %.2f %s | %s | %.1f | %.2f %s |\n", s, r.iters[s],
			median(r.col(s, func(x rtRow) float64 { return x.ours }))/1e3, rows[0].sameName,
			median(r.col(s, func(x rtRow) float64 { return x.same }))/1e3, median(same), rangeOf(same, "%.2f"),
			rows[0].floorName, median(r.col(s, func(x rtRow) float64 { return x.floor }))/1e3, median(floor), rangeOf(floor, "%.2f"))
	}
	p("\n")
}

// redactArgs returns args with the passwords and tokens of the URLs among
// them (-redis=..., -postgres ..., and so on) masked by [stores.Redact]: the
// report is committed to the repository.
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		flag, raw, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(flag, "-") {
			flag, raw = "", a
		}
		if u, err := url.Parse(raw); err == nil && strings.Contains(raw, "://") {
			raw = stores.Redact(u)
		}
		if flag != "" {
			raw = flag + "=" + raw
		}
		out[i] = raw
	}
	return out
}
