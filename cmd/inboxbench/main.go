// Command inboxbench measures the inbox middleware in one run, with
// interleaved repetitions and medians, and prints markdown tables:
//
//  1. router throughput on RabbitMQ and on Kafka (in-process kfake) with no
//     middleware, with Watermill's Deduplicator (in memory and over Redis)
//     and with the inbox on memory, Redis, PostgreSQL, MariaDB, SQLite and
//     the remote store over Redis, and with floor-redis (a bare SET NX PX
//     claim per message through the stores' group commit, nothing after the
//     handler: the least any claim on Redis can cost), each as a ratio to
//     the no-middleware baseline of the same repetition; for the variants
//     that use Redis, the Redis server's CPU time per message (INFO cpu
//     before and after each trial); for the variants whose store batches,
//     the mean calls per round trip (the store's BatchStats before and
//     after each trial);
//  2. scaling of the same with 4 and 16 concurrent consumers;
//  3. the middleware's own cost per message on the memory store (CPU time and
//     allocations, against no middleware and the Deduplicator);
//  4. store round trips, TryBegin+Complete against the raw client running the
//     same scripts or statements and against the least equivalent raw work,
//     by running the stores' interleaved Go benchmarks.
//
// Each repetition runs every variant once, in an order rotated from one
// repetition to the next; ratios are taken within a repetition, then the
// median over repetitions is reported. The load average is printed at the
// start and the end. The report ends with the targets table of issue 14 (and
// the guards of issue 13), which -benchmarks-md also writes into
// BENCHMARKS.md, between markers, with the machine and the command.
//
//	go run . -md ../../docs/bench-results.md -svg ../../docs/throughput.svg -benchmarks-md ../../BENCHMARKS.md
//
// (`make bench` in the repository root.) Services: RabbitMQ, Redis,
// PostgreSQL and MariaDB at the addresses of the tests (INBOX_TEST_AMQP_URL,
// INBOX_TEST_REDIS_URL, INBOX_TEST_POSTGRES_URL, INBOX_TEST_MYSQL_URL);
// Kafka is an in-process kfake cluster unless KAFKA_BROKERS is set.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

type options struct {
	runID string
	args  []string // the command line, for the report

	sections      []string
	reps          int
	n             int
	scaleN        int
	kafkaN        int
	kafkaScaleN   int
	consumers     []int
	brokers       []string
	variants      []string
	scaleVariants []string
	trialTimeout  time.Duration

	microN        int
	microVariants []string
	microYield    bool

	repo       string
	rtScale    float64
	rtPackages []string
	goCmd      string

	amqpURL      string
	redisURL     string
	postgresURL  string
	mysqlURL     string
	kafkaBrokers []string

	mdPath         string
	svgPath        string
	benchmarksPath string
	quiet          bool
	cpuProfile     string
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("inboxbench", flag.ContinueOnError)
	sections := fs.String("sections", "micro,router,roundtrip", "sections to run: micro, router (with scaling), roundtrip")
	fs.IntVar(&o.reps, "reps", 7, "repetitions; medians are taken over them")
	fs.IntVar(&o.n, "n", 2000, "messages per RabbitMQ trial with one consumer")
	fs.IntVar(&o.scaleN, "scale-n", 4000, "messages per RabbitMQ trial with more than one consumer")
	fs.IntVar(&o.kafkaN, "kafka-n", 10000, "messages per Kafka trial with one consumer")
	fs.IntVar(&o.kafkaScaleN, "kafka-scale-n", 10000, "messages per Kafka trial with more than one consumer")
	consumers := fs.String("consumers", "1,4,16", "concurrent consumers of the scaling table (1 is the main table)")
	brokers := fs.String("brokers", "rabbitmq,kafka", "brokers: rabbitmq, kafka")
	variants := fs.String("variants", "none,deduplicator-memory,deduplicator-redis,floor-redis,inbox-memory,inbox-redis,inbox-postgres,inbox-mariadb,inbox-sqlite,inbox-remote-redis", "variants with one consumer, on every broker (none is the baseline, and first; known: "+variantNames()+")")
	scaleVariants := fs.String("scale-variants", "none,deduplicator-redis,floor-redis,inbox-redis,inbox-postgres,inbox-mariadb,inbox-sqlite", "variants with more than one consumer, on every broker (none first; any of -variants' known names)")
	fs.DurationVar(&o.trialTimeout, "trial-timeout", 2*time.Minute, "bound on one router trial")
	fs.IntVar(&o.microN, "micro-n", 100000, "messages per repetition of the middleware micro benchmark")
	microVariants := fs.String("micro-variants", "none,deduplicator-memory,inbox-memory", "contenders of the micro benchmark (none is the baseline; any variant of -variants may be named)")
	fs.BoolVar(&o.microYield, "micro-yield", false, "micro benchmark: yield (runtime.Gosched) after each message, so the inbox's mark runs before the next message; with GOMAXPROCS=1 this makes instruction counts under callgrind repeatable")
	fs.StringVar(&o.repo, "repo", "", "repository root, for the stores' round-trip benchmarks (default: found from the working directory)")
	fs.Float64Var(&o.rtScale, "roundtrip-scale", 1, "scales the iterations of each store round-trip benchmark run (Redis 3000, SQL 1000)")
	rtPackages := fs.String("roundtrip-stores", "redis,sql", "store packages whose round trips are measured: redis, sql")
	fs.StringVar(&o.goCmd, "go", "go", "the go command, to build the store benchmarks")
	fs.StringVar(&o.amqpURL, "amqp", envOr("INBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	fs.StringVar(&o.redisURL, "redis", envOr("INBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"), "Redis URL")
	fs.StringVar(&o.postgresURL, "postgres", envOr("INBOX_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL URL")
	fs.StringVar(&o.mysqlURL, "mysql", envOr("INBOX_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"), "MariaDB or MySQL URL (inbox-mariadb, and round trips of the SQL store)")
	kafkaBrokers := fs.String("kafka", os.Getenv("KAFKA_BROKERS"), "Kafka brokers (host:port,...); empty starts an in-process kfake cluster")
	fs.StringVar(&o.mdPath, "md", "", "also write the report to this markdown file")
	fs.StringVar(&o.svgPath, "svg", "", "write the throughput chart to this SVG file")
	fs.StringVar(&o.benchmarksPath, "benchmarks-md", "", "replace the targets section of this markdown file (BENCHMARKS.md), between the markers "+sectionBegin+" and "+sectionEnd+", with this run's; appended when the markers are absent")
	fs.BoolVar(&o.quiet, "q", false, "no progress lines on stderr")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.sections = splitList(*sections)
	o.brokers = splitList(*brokers)
	o.variants = splitList(*variants)
	o.scaleVariants = splitList(*scaleVariants)
	o.rtPackages = splitList(*rtPackages)
	o.microVariants = splitList(*microVariants)
	o.kafkaBrokers = splitList(*kafkaBrokers)
	for _, c := range splitList(*consumers) {
		k, err := strconv.Atoi(c)
		if err != nil || k < 1 {
			return o, fmt.Errorf("-consumers: %q is not a positive integer", c)
		}
		o.consumers = append(o.consumers, k)
	}
	if o.reps < 1 || o.n < 1 || o.scaleN < 1 || o.kafkaN < 1 || o.kafkaScaleN < 1 || o.microN < 1 || o.rtScale <= 0 {
		return o, fmt.Errorf("-reps, -n, -scale-n, -kafka-n, -kafka-scale-n, -micro-n and -roundtrip-scale must be positive")
	}
	if len(o.variants) == 0 || o.variants[0] != baseline {
		return o, fmt.Errorf("-variants must start with the baseline %q", baseline)
	}
	if len(o.microVariants) == 0 || o.microVariants[0] != baseline {
		return o, fmt.Errorf("-micro-variants must start with the baseline %q", baseline)
	}
	if len(o.scaleVariants) == 0 || o.scaleVariants[0] != baseline {
		return o, fmt.Errorf("-scale-variants must start with the baseline %q", baseline)
	}
	o.runID = strings.ToLower(watermill.NewShortUUID())[:8]
	o.args = args
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var progress io.Writer = os.Stderr
	if o.quiet {
		progress = io.Discard
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	if err := run(ctx, o, os.Stdout, progress); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "inboxbench:", err)
		os.Exit(1)
	}
}

func (o options) has(section string) bool {
	for _, s := range o.sections {
		if s == section {
			return true
		}
	}
	return false
}

// run runs the sections and writes the report to out.
func run(ctx context.Context, o options, out, progress io.Writer) error {
	rep := &report{opts: o, started: time.Now(), loadStart: loadAvg()}
	rep.machine = describeMachine(ctx, o)
	logf := func(format string, args ...any) {
		fmt.Fprintf(progress, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	logf("inboxbench run %s, load average %s", o.runID, rep.loadStart)

	if o.has("micro") {
		r, err := runMicro(ctx, o, logf)
		if err != nil {
			return fmt.Errorf("micro: %w", err)
		}
		rep.micro = r
	}
	if o.has("router") {
		r, err := runRouter(ctx, o, logf)
		if err != nil {
			return fmt.Errorf("router: %w", err)
		}
		rep.router = r
	}
	if o.has("roundtrip") {
		r, err := runRoundTrips(ctx, o, logf)
		if err != nil {
			return fmt.Errorf("round trips: %w", err)
		}
		rep.roundtrip = r
	}
	rep.finished = time.Now()
	rep.loadEnd = loadAvg()
	logf("done in %s, load average %s", rep.finished.Sub(rep.started).Round(time.Second), rep.loadEnd)

	md := rep.markdown()
	if _, err := io.WriteString(out, md); err != nil {
		return err
	}
	if o.mdPath != "" {
		if err := os.WriteFile(o.mdPath, []byte(md), 0o644); err != nil {
			return err
		}
	}
	if o.svgPath != "" && rep.router != nil {
		if err := os.WriteFile(o.svgPath, []byte(rep.router.chart()), 0o644); err != nil {
			return err
		}
	}
	if o.benchmarksPath != "" {
		if err := writeSection(o.benchmarksPath, rep.targetsSection()); err != nil {
			return err
		}
	}
	return nil
}
