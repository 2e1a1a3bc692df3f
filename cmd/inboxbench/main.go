// Command inboxbench measures the inbox middleware in one run, with
// interleaved repetitions and medians, and prints markdown tables:
//
//  1. router throughput on RabbitMQ and on Kafka (in-process kfake) with no
//     middleware, with Watermill's Deduplicator (in memory and over Redis)
//     and with the inbox on memory, Redis, PostgreSQL, MariaDB, SQLite and
//     the remote store over Redis, and with the floors, through the stores'
//     group commit: floor-redis (a bare SET NX PX claim per message, nothing
//     after the handler: the least any claim on Redis can cost) and
//     floor2-redis and floor2-postgres (a bare claim before the handler and
//     a bare mark after the ack: the least any inbox can cost), each as a
//     ratio to the no-middleware baseline of the same repetition; for the
//     variants that use Redis, the Redis server's CPU time per message (INFO
//     cpu before and after each trial); for the variants whose store
//     batches, the mean calls per round trip (the store's BatchStats before
//     and after each trial);
//  2. scaling of the same with 4 and 16 concurrent consumers;
//
// both at each store round-trip time of -store-rtt: at 0 the stores are
// on loopback; above, every connection to Redis, PostgreSQL and MariaDB
// goes through a proxy in this process that holds the servers' replies for
// that time (internal/faultproxy), for the variants that reach such a
// store;
//
//  3. failures: the inbox on Redis with the broker holding failed
//     attempts' backoffs (Config.Redelivery: RabbitMQ delay queues with 4
//     consumers, Kafka retry topics with 16 partitions), with handlers that
//     never fail, fail 10% of their attempts, and do so with a poison key
//     per consumer (MaxAttempts 3); and the same failures waited out in the
//     consumer (no Redelivery), at a size of its own; and the hand-off
//     floor, the same router and handler with no inbox and no store,
//     handing every failed attempt to the same delay queues or retry topics:
//     keys processed per second until 90% and until all were, the waits
//     against their backoff, the dead keys' attempts, the hand-offs and
//     store calls per failed attempt, and the inbox's ratio with failures
//     relative to the floor's;
//  4. order per key: Kafka with 16 partitions, ordering keys of
//     10 messages each, 10% of first attempts failing, with
//     Config.OrderKey and Redelivery, with Redelivery alone, and with
//     neither (the consumer waits out the backoff): messages processed per
//     second until 90% were, and every key's effects checked against its
//     publish order (order.go);
//  5. the middleware's own cost per message on the memory store (CPU time and
//     allocations, against no middleware and the Deduplicator);
//  6. store round trips, TryBegin+Complete against the raw client running the
//     same scripts or statements and against the least equivalent raw work,
//     by running the stores' interleaved Go benchmarks;
//  7. sizing: the bytes a processed key costs each store
//     (Redis, PostgreSQL, MariaDB, SQLite, MongoDB on FerretDB, memory)
//     against its floor, the key and its expiry alone; PostgreSQL's WAL per
//     message against its floor's; and the claim-and-mark throughput of
//     Redis, PostgreSQL and MariaDB holding -sizing-prefill retained keys
//     (bulk-loaded as copies of a record the store wrote) against the same
//     store empty, without and then with keys expiring at the write rate and
//     the store's janitor deleting them (see sizing.go).
//
// Each repetition runs every variant once, in an order rotated from one
// repetition to the next; ratios are taken within a repetition, then the
// median over repetitions is reported. The load average is printed at the
// start and the end. The report ends with the targets table (and the
// guards of the middleware's own cost), which -benchmarks-md also writes
// into BENCHMARKS.md, between markers, with the machine and the command.
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
	"slices"
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
	storeRTTs     []time.Duration // one router section each; 0 is loopback

	failuresN               int
	failuresKafkaN          int
	failuresInProcessN      int
	failuresKafkaInProcessN int
	failuresVariants        []string
	failuresReps            int
	failuresBackoff         time.Duration
	failuresRetryPartitions int

	orderKeys      int
	orderUnsetKeys int
	orderReps      int
	orderStores    []string
	orderTimeout   time.Duration

	sizingN       int
	sizingMongoN  int
	sizingReps    int
	sizingPrefill int
	sizingTrial   time.Duration
	sizingStores  []string
	sizingThr     []string
	mariadbd      string
	pgBin         string
	mariadbPool   string
	redisServer   string

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
	sections := fs.String("sections", "micro,router,failures,roundtrip,sizing", "sections to run: micro, router (with scaling), failures, order (not by default: some 10 minutes), roundtrip, sizing")
	fs.IntVar(&o.reps, "reps", 7, "repetitions; medians are taken over them")
	fs.IntVar(&o.n, "n", 2000, "messages per RabbitMQ trial with one consumer")
	fs.IntVar(&o.scaleN, "scale-n", 4000, "messages per RabbitMQ trial with more than one consumer")
	fs.IntVar(&o.kafkaN, "kafka-n", 10000, "messages per Kafka trial with one consumer")
	fs.IntVar(&o.kafkaScaleN, "kafka-scale-n", 10000, "messages per Kafka trial with more than one consumer")
	consumers := fs.String("consumers", "1,4,16", "concurrent consumers of the scaling table (1 is the main table)")
	brokers := fs.String("brokers", "rabbitmq,kafka", "brokers: rabbitmq, kafka")
	variants := fs.String("variants", "none,deduplicator-memory,deduplicator-redis,floor-redis,floor2-redis,floor2f-redis,store-redis,inbox-memory,inbox-redis,floor2-postgres,inbox-postgres,inbox-mariadb,inbox-sqlite,inbox-remote-redis", "variants with one consumer, on every broker (none is the baseline, and first; known: "+variantNames()+")")
	scaleVariants := fs.String("scale-variants", "none,deduplicator-redis,floor-redis,floor2-redis,floor2f-redis,store-redis,inbox-redis,floor2-postgres,inbox-postgres,inbox-mariadb,inbox-sqlite", "variants with more than one consumer, on every broker (none first; any of -variants' known names)")
	storeRTTs := fs.String("store-rtt", "0,"+targetRTT.String(), "store round-trip times, one router section each: above 0, every connection to Redis, PostgreSQL and MariaDB goes through a proxy in this process that holds the servers' replies that long (internal/faultproxy), and only the variants that reach such a store run, with none")
	fs.DurationVar(&o.trialTimeout, "trial-timeout", 2*time.Minute, "bound on one router trial (a failures trial gets at least 5 min: its backoffs' tail)")
	fs.IntVar(&o.failuresN, "failures-n", 3000, "failures section: keys per RabbitMQ trial (4 consumers), poison keys besides")
	fs.IntVar(&o.failuresKafkaN, "failures-kafka-n", 10000, "failures section: keys per Kafka trial (16 partitions), poison keys besides")
	fs.IntVar(&o.failuresInProcessN, "failures-inprocess-n", 300, "failures section: keys per RabbitMQ trial of the in-process wait and its baseline (its failed keys stall their consumer for their backoff)")
	fs.IntVar(&o.failuresKafkaInProcessN, "failures-kafka-inprocess-n", 800, "failures section: keys per Kafka trial of the in-process wait and its baseline")
	failuresVariants := fs.String("failures-variants", failureVariantNames(), "failures section: variants (the baseline "+failuresBaseline+" always runs; known: "+failureVariantNames()+")")
	fs.IntVar(&o.failuresReps, "failures-reps", 0, "failures section: repetitions; 0: -reps, at most 3 (its trials with failures take 10 s to a minute each, most of it the backoff's tail)")
	fs.DurationVar(&o.failuresBackoff, "failures-backoff", time.Second, "failures section: base of the inbox's backoff, full jitter up to base × 2^attempt, at most 1 min (1s: inboxmw.DefaultBackoff)")
	fs.IntVar(&o.failuresRetryPartitions, "failures-retry-partitions", 0, "failures section: partitions of each Kafka retry topic (inboxkafka.RetryConfig.Partitions; 0: its default)")
	fs.IntVar(&o.orderKeys, "order-keys", 2000, "order section: ordering keys per trial of the ordered and unordered variants, 10 messages each")
	fs.IntVar(&o.orderUnsetKeys, "order-unset-keys", orderUnsetKeysDefault, "order section: ordering keys per trial of the redelivery-unset variant (its failed messages stall their partition for their backoff)")
	fs.IntVar(&o.orderReps, "order-reps", 0, "order section: repetitions; 0: -reps, at most 3")
	fs.DurationVar(&o.orderTimeout, "order-timeout", 3*time.Minute, "order section: a trial past its 90% point is cut this long after its consumers start, its messages not applied by then counted (the ordered variant's messages behind a failed one drain for minutes)")
	orderStores := fs.String("order-stores", "redis", "order section: the inbox's stores, one set of trials each: redis, postgres, memory")
	fs.IntVar(&o.sizingN, "sizing-n", 20000, "sizing section: keys claimed and marked per store for the bytes per key")
	fs.IntVar(&o.sizingMongoN, "sizing-mongo-n", 300, "sizing section: the same on MongoDB (FerretDB in-process scans its collection on every write: 200 keys take some 20 s, and the time grows with the square)")
	fs.IntVar(&o.sizingPrefill, "sizing-prefill", 5_000_000, "sizing section: retained keys bulk-loaded before the prefilled store's trials")
	fs.DurationVar(&o.sizingTrial, "sizing-trial", 8*time.Second, "sizing section: length of a claim-and-mark trial")
	fs.IntVar(&o.sizingReps, "sizing-reps", 5, "sizing section: repetitions of the trials (empty and prefilled, alternated)")
	sizingStores := fs.String("sizing-stores", "redis,postgres,mariadb,sqlite,mongo,memory", "sizing section: stores whose bytes per key are measured (mongo: FerretDB in-process, run by go run in ./mongosizing)")
	sizingThr := fs.String("sizing-prefill-stores", "redis,postgres,mariadb", "sizing section: stores whose throughput is measured prefilled: redis, postgres, mariadb")
	fs.StringVar(&o.redisServer, "redis-server", "redis-server", "sizing section: the redis-server binary of the section's own servers (its Redis figures never touch -redis)")
	fs.StringVar(&o.mariadbd, "sizing-mariadbd", "mariadbd", "sizing section: the mariadbd binary of the section's own server for the prefilled MariaDB rows (needs mariadb-install-db on PATH); empty: the server of -mysql")
	fs.StringVar(&o.pgBin, "sizing-postgres", findPostgres(), "sizing section: the directory of initdb and postgres for the section's own server of the prefilled PostgreSQL rows (as root, it runs as the postgres user); empty: the server of -postgres")
	fs.StringVar(&o.mariadbPool, "sizing-mariadb-pool", "4G", "sizing section: innodb_buffer_pool_size of that server, enough to hold the prefilled table")
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
	o.failuresVariants = splitList(*failuresVariants)
	o.sizingStores = splitList(*sizingStores)
	o.orderStores = splitList(*orderStores)
	if err := pickOrderStores(o.orderStores); err != nil {
		return o, err
	}
	if o.orderReps == 0 {
		o.orderReps = min(o.reps, 3)
	}
	if o.orderKeys < 1 || o.orderUnsetKeys < 1 || o.orderReps < 1 || o.orderTimeout <= 0 {
		return o, fmt.Errorf("-order-keys, -order-unset-keys, -order-reps and -order-timeout must be positive")
	}
	o.sizingThr = splitList(*sizingThr)
	if o.sizingN < 1 || o.sizingMongoN < 1 || o.sizingReps < 1 || o.sizingPrefill < 1 || o.sizingTrial <= 0 {
		return o, fmt.Errorf("-sizing-n, -sizing-mongo-n, -sizing-reps, -sizing-prefill and -sizing-trial must be positive")
	}
	for _, s := range o.sizingStores {
		if !slices.Contains([]string{"redis", "postgres", "mariadb", "sqlite", "mongo", "memory"}, s) {
			return o, fmt.Errorf("-sizing-stores: unknown store %q (known: redis, postgres, mariadb, sqlite, mongo, memory)", s)
		}
	}
	for _, s := range o.sizingThr {
		if !slices.Contains([]string{"redis", "postgres", "mariadb"}, s) {
			return o, fmt.Errorf("-sizing-prefill-stores: unknown store %q (known: redis, postgres, mariadb)", s)
		}
	}
	if o.pgBin != "" {
		if err := checkPostgresBin(o.pgBin); err != nil {
			return o, err
		}
	}
	if _, err := pickFailures(o.failuresVariants); err != nil {
		return o, fmt.Errorf("-failures-variants: %w", err)
	}
	o.kafkaBrokers = splitList(*kafkaBrokers)
	for _, r := range splitList(*storeRTTs) {
		d, err := time.ParseDuration(r)
		if err != nil || d < 0 {
			return o, fmt.Errorf("-store-rtt: %q is not a duration of 0 or more (250us, 1ms)", r)
		}
		if slices.Contains(o.storeRTTs, d) {
			return o, fmt.Errorf("-store-rtt: %s is given twice", d)
		}
		o.storeRTTs = append(o.storeRTTs, d)
	}
	if len(o.storeRTTs) == 0 {
		return o, fmt.Errorf("-store-rtt: give at least one duration (0: loopback)")
	}
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
	if o.failuresReps == 0 {
		o.failuresReps = min(o.reps, 3)
	}
	if o.failuresReps < 1 || o.failuresN < 1 || o.failuresKafkaN < 1 || o.failuresInProcessN < 1 || o.failuresKafkaInProcessN < 1 || o.failuresBackoff <= 0 || o.failuresRetryPartitions < 0 {
		return o, fmt.Errorf("-failures-reps, -failures-n, -failures-kafka-n, -failures-inprocess-n, -failures-kafka-inprocess-n and -failures-backoff must be positive, and -failures-retry-partitions 0 or more")
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
	if o.has("failures") {
		r, err := runFailures(ctx, o, logf)
		if err != nil {
			return fmt.Errorf("failures: %w", err)
		}
		rep.failures = r
	}
	if o.has("order") {
		r, err := runOrder(ctx, o, logf)
		if err != nil {
			return fmt.Errorf("order: %w", err)
		}
		rep.order = r
	}
	if o.has("roundtrip") {
		r, err := runRoundTrips(ctx, o, logf)
		if err != nil {
			return fmt.Errorf("round trips: %w", err)
		}
		rep.roundtrip = r
	}
	if o.has("sizing") {
		r, err := runSizing(ctx, o, logf)
		if err != nil {
			return fmt.Errorf("sizing: %w", err)
		}
		rep.sizing = r
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
