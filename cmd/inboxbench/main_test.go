package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox/internal/testenv"
)

// TestRun_smoke runs every section of the harness with tiny sizes (two
// repetitions, a few dozen messages per trial) and checks that the report
// and the chart hold every variant, that the router tables give batch sizes
// for the variants whose store batches, and that the targets section lands
// between the markers of a BENCHMARKS.md, the rest of it intact. It
// measures nothing; `make bench` does.
func TestRun_smoke(t *testing.T) {
	amqpURL := testenv.RabbitMQ.URL(t)
	redisURL := testenv.Redis.URL(t)
	pgURL := testenv.Postgres.URL(t)
	myURL := testenv.MySQL.URL(t)
	dir := t.TempDir()
	md, svg, bmd := filepath.Join(dir, "bench.md"), filepath.Join(dir, "chart.svg"), filepath.Join(dir, "BENCHMARKS.md")
	above, below := "# Benchmarks\n\n## How to run it\n\nkept\n\n", "\n\n## Results\n\nkept too\n"
	if err := os.WriteFile(bmd, []byte(above+sectionBegin+"\nstale table\n"+sectionEnd+below), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{
		"-reps", "2", "-n", "40", "-scale-n", "40", "-kafka-n", "40", "-kafka-scale-n", "40",
		"-consumers", "1,16", "-micro-n", "500",
		"-roundtrip-stores", "redis", "-roundtrip-scale", "0.01",
		"-amqp", amqpURL, "-redis", redisURL, "-postgres", pgURL, "-mysql", myURL, "-kafka", "",
		"-md", md, "-svg", svg, "-benchmarks-md", bmd,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out, progress bytes.Buffer
	if err := run(ctx, o, &out, &progress); err != nil {
		t.Fatalf("run: %v\nprogress:\n%s", err, progress.String())
	}
	report := out.String()
	for _, want := range []string{
		"## Router throughput, one consumer", "### rabbitmq (40 messages per trial)", "### kafka (40 messages per trial)",
		"## Scaling with concurrent consumers", "| 1 consumer | 16 consumers |",
		"## Middleware cost per message", "## Store round trips", "| redis | 30 |",
		"Load average", "RabbitMQ ", "MariaDB/MySQL ",
		"| variant | msg/s | ratio to none | CPU µs/msg | Redis CPU µs/msg | calls/round trip |",
		"Redis CPU µs/msg, 16 consumers |", "calls/round trip, 1 consumer | calls/round trip, 16 consumers |",
		"## Targets\n",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	for _, v := range allVariants() {
		if !strings.Contains(report, "| "+v.name+" |") {
			t.Errorf("report lacks a row for %s", v.name)
		}
	}
	// Batch sizes: a figure (a mean of at least one call per round trip) for
	// the Redis store, the floor and the remote store's server, in both
	// tables of both brokers; none for a variant without a store.
	router := report[:strings.Index(report, "## Middleware cost")]
	for _, v := range []string{"floor-redis", "inbox-redis", "inbox-remote-redis", "none", "deduplicator-redis"} {
		rows := rowsOf(router, v)
		if len(rows) == 0 {
			t.Fatalf("no rows for %s", v)
		}
		for _, row := range rows {
			last := row[len(row)-1]
			batches := v != "none" && v != "deduplicator-redis"
			if mean, err := strconv.ParseFloat(strings.Fields(last + " x")[0], 64); batches && (err != nil || mean < 1) {
				t.Errorf("%s: calls per round trip %q, want a mean of at least 1 in %q", v, last, row)
			} else if !batches && last != "" {
				t.Errorf("%s: calls per round trip %q, want none in %q", v, last, row)
			}
		}
	}
	written, err := os.ReadFile(md)
	if err != nil || string(written) != report {
		t.Errorf("-md file differs from the printed report (err %v)", err)
	}
	chart, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(chart, []byte("<svg")) || !bytes.HasSuffix(chart, []byte("</svg>\n")) {
		t.Errorf("chart is not an SVG document:\n%s", chart)
	}
	for _, v := range allVariants() {
		if !bytes.Contains(chart, []byte(">"+v.name+"<")) {
			t.Errorf("chart lacks a bar for %s", v.name)
		}
	}

	b, err := os.ReadFile(bmd)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.HasPrefix(doc, above+sectionBegin+"\n") || !strings.HasSuffix(doc, sectionEnd+below) || strings.Contains(doc, "stale table") {
		t.Fatalf("-benchmarks-md did not replace exactly the section between the markers:\n%s", doc)
	}
	section := doc[len(above) : len(doc)-len(below)]
	for _, want := range []string{
		"## Targets of issue 14", "Run `" + o.runID + "`", "2 repetitions", "Load average", "CPU: ", "Go: go", "Redis ", "PostgreSQL ", "MariaDB/MySQL ",
		"Command: `inboxbench -reps 2 ",
		"| Kafka, 16 partitions: inbox-redis ÷ deduplicator-redis | ", "| ≥ 2.0 |",
		"| Redis server CPU per message, Kafka, 16 partitions: inbox-redis ÷ deduplicator-redis | ", "| ≤ 1.0 |",
		"| RabbitMQ, 16 consumers: inbox-redis ÷ none | ",
		"| Kafka, 16 partitions: inbox-mariadb ÷ none | ", "| Kafka, 16 partitions: inbox-sqlite ÷ none | ",
		"| Kafka, 1 partition: inbox-redis ÷ floor-redis | ", "| Kafka, 16 partitions: inbox-redis ÷ floor-redis | ",
		"| Guard (issue 13): middleware overhead of inbox-memory over none, CPU per message, no broker | ",
		"| Guard (issue 13): RabbitMQ, 1 consumer: inbox-memory ÷ none | ",
	} {
		if !strings.Contains(section, want) {
			t.Errorf("generated section lacks %q:\n%s", want, section)
		}
	}
	// Every variant ran: every row has a figure, and a row with a target a
	// verdict.
	rows := 0
	for _, l := range strings.Split(section, "\n") {
		if !strings.HasPrefix(l, "| Kafka") && !strings.HasPrefix(l, "| RabbitMQ") && !strings.HasPrefix(l, "| Redis") && !strings.HasPrefix(l, "| Guard") {
			continue
		}
		rows++
		cells := strings.Split(l, " | ")
		if strings.Contains(l, "not run") || !strings.Contains(cells[1], "[") {
			t.Errorf("row without a figure: %s", l)
		}
		if target := cells[2]; target != "" && target != "|" && !strings.Contains(l, "| met |") && !strings.Contains(l, "| **not met** |") {
			t.Errorf("row with a target and no verdict: %s", l)
		}
	}
	if rows != 12 {
		t.Errorf("%d rows in the targets table, want 12:\n%s", rows, section)
	}
}

// rowsOf returns the cells of every table row of report for variant v.
func rowsOf(report, v string) [][]string {
	var out [][]string
	for _, l := range strings.Split(report, "\n") {
		if strings.HasPrefix(l, "| "+v+" |") {
			cells := strings.Split(strings.Trim(l, "|"), "|")
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			out = append(out, cells)
		}
	}
	return out
}

// TestTargets_not_run: a row whose variants did not run says so, and has no
// verdict.
func TestTargets_not_run(t *testing.T) {
	t.Parallel()
	rep := &report{}
	var b strings.Builder
	rep.targetsTable(&b)
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n")[2:] {
		if !strings.Contains(l, "| not run |") || strings.Contains(l, "met |") {
			t.Errorf("row of a run without sections: %s", l)
		}
	}
}

func TestParseFlags_rejects_bad_values(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-reps", "0"},
		{"-consumers", "1,x"},
		{"-variants", "inbox-redis"}, // the baseline must come first
		{"-scale-variants", "inbox-redis,none"},
		{"-roundtrip-scale", "0"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median of 3 = %v", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median of 4 = %v", got)
	}
	if got := rotate([]int{1, 2, 3}, 4); !slices.Equal(got, []int{2, 3, 1}) {
		t.Errorf("rotate by 4 = %v", got)
	}
	lines, err := parseBench([]byte("goos: linux\nBenchmarkX/sub-2   \t 100\t  5 ns/op\t 0.9 a/b\nPASS\n"))
	if err != nil || len(lines) != 1 || lines[0].name != "BenchmarkX/sub" || lines[0].metrics["a/b"] != 0.9 {
		t.Errorf("parseBench = %+v, %v", lines, err)
	}
}

func TestRedactArgs_masks_passwords_in_URL_flags(t *testing.T) {
	got := strings.Join(redactArgs([]string{"-reps", "3", "-redis=redis://:s3cret@h:6379/1", "-postgres", "postgres://u:s3cret@h/db", "-q"}), " ")
	if strings.Contains(got, "s3cret") || !strings.Contains(got, "-redis=redis://") || !strings.Contains(got, "-reps 3") || !strings.HasSuffix(got, "-q") {
		t.Fatalf("redactArgs = %q", got)
	}
}

// TestFloorRedis_acks_a_claimed_key: the floor claims a new key and runs the
// handler, acks a message whose key is set without running it, and leaves a
// key that expires after the lease.
func TestFloorRedis_acks_a_claimed_key(t *testing.T) {
	t.Parallel()
	c, prefix := floorClient(t)
	f := newFloor(c, prefix, 30*time.Second)
	calls := 0
	h := f.middleware(func(*message.Message) ([]*message.Message, error) {
		calls++
		return nil, nil
	})
	msg := message.NewMessage(watermill.NewUUID(), nil)
	for range 2 {
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 {
		t.Errorf("handler ran %d times, want 1", calls)
	}
	ttl, err := c.PTTL(context.Background(), prefix+msg.UUID).Result()
	if err != nil || ttl <= 0 || ttl > 30*time.Second {
		t.Errorf("PTTL of the claim = %v, %v; want within the 30 s lease", ttl, err)
	}
	if got := f.BatchStats(); got.RoundTrips != 2 || got.Calls != 2 || got.Sizes[0] != 2 {
		t.Errorf("BatchStats after two sequential claims = %+v, want two round trips of one call", got)
	}
}

// TestFloorRedis_batches_concurrent_claims: concurrent claims share
// pipelines, each message id is claimed exactly once whatever batch its
// duplicates travel in, and BatchStats counts every call.
func TestFloorRedis_batches_concurrent_claims(t *testing.T) {
	t.Parallel()
	c, prefix := floorClient(t)
	f := newFloor(c, prefix, 30*time.Second)
	var handled sync.Map // id -> *atomic.Int64
	h := f.middleware(func(m *message.Message) ([]*message.Message, error) {
		n, _ := handled.LoadOrStore(m.UUID, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return nil, nil
	})
	const ids, copies = 64, 2
	total := 0
	deadline := time.Now().Add(30 * time.Second)
	for round := 0; ; round++ {
		// Every id twice, all at once: the duplicates race their originals.
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, ids*copies)
		for i := range ids * copies {
			id := fmt.Sprintf("r%d-m%d", round, i%ids)
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if _, err := h(message.NewMessage(id, nil)); err != nil {
					errs <- err
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		total += ids * copies
		s := f.BatchStats()
		var trips uint64
		for _, n := range s.Sizes {
			trips += n
		}
		if s.Calls != uint64(total) || trips != s.RoundTrips {
			t.Fatalf("BatchStats = %+v after %d calls: calls or size buckets do not add up", s, total)
		}
		if s.RoundTrips < s.Calls {
			break // some round trip carried several claims
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d concurrent claims in %d rounds, never two in one round trip: %+v", total, round+1, s)
		}
	}
	n := 0
	handled.Range(func(id, count any) bool {
		n++
		if c := count.(*atomic.Int64).Load(); c != 1 {
			t.Errorf("message %v handled %d times, want once", id, c)
		}
		return true
	})
	if n != total/copies {
		t.Errorf("%d messages handled, want %d", n, total/copies)
	}
}

// floorClient is a client of the test Redis and a key prefix of the test's
// own, whose keys are deleted at the end.
func floorClient(t *testing.T) (*redis.Client, string) {
	t.Helper()
	ro, err := redis.ParseURL(testenv.Redis.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(ro)
	prefix := "inboxbench-test:" + strings.ToLower(watermill.NewShortUUID()) + ":"
	t.Cleanup(func() {
		_ = deletePrefix(context.Background(), c, prefix)
		_ = c.Close()
	})
	return c, prefix
}

// TestReplaceSection: the section replaces what lies between the markers
// and nothing else; a document without markers gets it appended; a broken
// pair of markers is an error.
func TestReplaceSection(t *testing.T) {
	t.Parallel()
	section := "## Targets\n\n| a | b |\n"
	block := sectionBegin + "\n" + section + sectionEnd
	for _, tc := range []struct{ name, doc, want string }{
		{"between markers", "# Title\n\nintro\n\n" + sectionBegin + "\nold table\nold line\n" + sectionEnd + "\n\n## Later\n\ntext\n",
			"# Title\n\nintro\n\n" + block + "\n\n## Later\n\ntext\n"},
		{"empty section", "a\n" + sectionBegin + "\n" + sectionEnd + "\nb", "a\n" + block + "\nb"},
		{"no markers", "# Title\n\ntext\n", "# Title\n\ntext\n\n" + block + "\n"},
		{"no final newline", "# Title", "# Title\n\n" + block + "\n"},
		{"empty document", "", block + "\n"},
		{"markers quoted in prose", "Between `" + sectionBegin + "` and `" + sectionEnd + "`.\n\n" + sectionBegin + "\nold\n" + sectionEnd + "\nend\n",
			"Between `" + sectionBegin + "` and `" + sectionEnd + "`.\n\n" + block + "\nend\n"},
		{"only quoted markers", "see `" + sectionBegin + "`\n", "see `" + sectionBegin + "`\n\n" + block + "\n"},
	} {
		got, err := replaceSection(tc.doc, section)
		if err != nil || got != tc.want {
			t.Errorf("%s: replaceSection =\n%q, %v\nwant\n%q", tc.name, got, err, tc.want)
		}
		// Idempotent: a second run replaces its own section.
		if again, err := replaceSection(got, section); err != nil || again != got {
			t.Errorf("%s: a second replaceSection changed the document:\n%q, %v", tc.name, again, err)
		}
	}
	for _, doc := range []string{
		sectionBegin + "\nno end\n",
		"no begin\n" + sectionEnd + "\n",
		sectionEnd + "\nreversed\n" + sectionBegin + "\n",
		sectionBegin + "\n" + sectionEnd + "\ntwice\n" + sectionBegin + "\n" + sectionEnd + "\n",
	} {
		if got, err := replaceSection(doc, section); err == nil {
			t.Errorf("replaceSection(%q) = %q, want an error", doc, got)
		}
	}
}

// TestWriteSection_on_a_file: the file keeps everything outside the markers,
// and a missing file is created with the section.
func TestWriteSection_on_a_file(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "B.md")
	before, after := "# Benchmarks\n\nkept above\n\n", "\n\n## Results\n\nkept below\n"
	if err := os.WriteFile(path, []byte(before+sectionBegin+"\nstale\n"+sectionEnd+after), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeSection(path, "fresh\n"); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if want := before + sectionBegin + "\nfresh\n" + sectionEnd + after; err != nil || string(got) != want {
		t.Errorf("file after writeSection:\n%q, %v\nwant\n%q", got, err, want)
	}
	fresh := filepath.Join(dir, "new.md")
	if err := writeSection(fresh, "fresh\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(fresh); err != nil || string(got) != sectionBegin+"\nfresh\n"+sectionEnd+"\n" {
		t.Errorf("new file: %q, %v", got, err)
	}
}

// TestReplaceSection_on_BENCHMARKS_md: the repository's BENCHMARKS.md has
// one pair of marker lines (it also quotes them in prose), and a run
// changes nothing outside them.
func TestReplaceSection_on_BENCHMARKS_md(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	got, err := replaceSection(doc, "## Fresh section\n")
	if err != nil {
		t.Fatal(err)
	}
	i, j := markerLines(doc, sectionBegin)[0], markerLines(doc, sectionEnd)[0]+len(sectionEnd)
	want := doc[:i] + sectionBegin + "\n## Fresh section\n" + sectionEnd + doc[j:]
	if got != want {
		t.Fatalf("replaceSection changed BENCHMARKS.md outside its markers")
	}
}
