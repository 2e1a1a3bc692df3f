package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"
)

// The markers of the generated section of BENCHMARKS.md (-benchmarks-md):
// what lies between them is replaced on every run.
const (
	sectionBegin = "<!-- inboxbench:targets:begin -->"
	sectionEnd   = "<!-- inboxbench:targets:end -->"
)

// targetFormat is how the targets table prints a value.
const targetFormat = "%.2f"

// A targetRow is one line of the targets table: a ratio (or a cost) taken
// within each repetition, and the bound it should meet.
type targetRow struct {
	what   string
	values []float64 // one per repetition; none when its variants did not run
	unit   string    // after the median, e.g. " µs"
	target string    // "≥ 2.0"; empty for a figure reported without a target
	ok     func(median float64) bool
}

func atLeast(x float64) func(float64) bool { return func(m float64) bool { return m >= x } }
func atMost(x float64) func(float64) bool  { return func(m float64) bool { return m <= x } }

// pairRatios returns, for each repetition of the group of broker at
// consumers, f of variant a over f of variant b in that repetition; none
// when the group or either variant did not run. f's second result tells
// whether the trial has the figure.
func (r *routerResults) pairRatios(broker string, consumers int, a, b string, f func(trialResult) (float64, bool)) []float64 {
	if r == nil {
		return nil
	}
	g := r.find(broker, consumers)
	if g < 0 {
		return nil
	}
	ta, tb := r.trials[g][a], r.trials[g][b]
	var out []float64
	for i := range min(len(ta), len(tb)) {
		x, okA := f(ta[i])
		y, okB := f(tb[i])
		if okA && okB && y > 0 {
			out = append(out, x/y)
		}
	}
	return out
}

func throughput(t trialResult) (float64, bool) { return t.rate(), true }

func redisCPU(t trialResult) (float64, bool) {
	return float64(t.redisCPUPerMsg()), t.redisMeasured
}

// targets are the rows of issue 14's targets table, and issue 13's guards,
// from the results of this run.
func (rep *report) targets() []targetRow {
	r := rep.router
	tp := func(broker string, consumers int, a, b string) []float64 {
		return r.pairRatios(broker, consumers, a, b, throughput)
	}
	rows := []targetRow{
		{what: "Kafka, 16 partitions: inbox-redis ÷ deduplicator-redis", values: tp("kafka", 16, "inbox-redis", "deduplicator-redis"), target: "≥ 2.0", ok: atLeast(2.0)},
		{what: "Kafka, 16 partitions: inbox-redis ÷ none", values: tp("kafka", 16, "inbox-redis", baseline), target: "≥ 0.3", ok: atLeast(0.3)},
		{what: "Kafka, 1 partition: inbox-redis ÷ deduplicator-redis", values: tp("kafka", 1, "inbox-redis", "deduplicator-redis"), target: "≥ 1.0", ok: atLeast(1.0)},
		{what: "Redis server CPU per message, Kafka, 16 partitions: inbox-redis ÷ deduplicator-redis", values: r.pairRatios("kafka", 16, "inbox-redis", "deduplicator-redis", redisCPU), target: "≤ 1.0", ok: atMost(1.0)},
		{what: "RabbitMQ, 16 consumers: inbox-redis ÷ none", values: tp("rabbitmq", 16, "inbox-redis", baseline), target: "≥ 0.85", ok: atLeast(0.85)},
		{what: "Kafka, 16 partitions: inbox-postgres ÷ none", values: tp("kafka", 16, "inbox-postgres", baseline), target: "≥ 0.10", ok: atLeast(0.10)},
		{what: "Kafka, 16 partitions: inbox-mariadb ÷ none", values: tp("kafka", 16, "inbox-mariadb", baseline)},
		{what: "Kafka, 16 partitions: inbox-sqlite ÷ none", values: tp("kafka", 16, "inbox-sqlite", baseline)},
		{what: "Kafka, 1 partition: inbox-redis ÷ floor-redis", values: tp("kafka", 1, "inbox-redis", "floor-redis"), target: "≥ 0.9", ok: atLeast(0.9)},
		{what: "Kafka, 16 partitions: inbox-redis ÷ floor-redis", values: tp("kafka", 16, "inbox-redis", "floor-redis"), target: "≥ 0.9", ok: atLeast(0.9)},
	}
	var micro []float64
	if m := rep.micro; m != nil {
		for _, ns := range m.overhead("inbox-memory") {
			micro = append(micro, ns/1e3)
		}
	}
	rows = append(rows,
		targetRow{what: "Guard (issue 13): middleware overhead of inbox-memory over none, CPU per message, no broker", values: micro, unit: " µs", target: "≤ 10 µs", ok: atMost(10)},
		targetRow{what: "Guard (issue 13): RabbitMQ, 1 consumer: inbox-memory ÷ none", values: tp("rabbitmq", 1, "inbox-memory", baseline), target: "≥ 0.9", ok: atLeast(0.9)},
	)
	return rows
}

// targetsTable writes the targets table.
func (rep *report) targetsTable(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("| measure | result: median [range] | target | |\n|---|--:|--:|---|\n")
	for _, row := range rep.targets() {
		if len(row.values) == 0 {
			p("| %s | not run | %s | |\n", row.what, row.target)
			continue
		}
		m := median(row.values)
		verdict := ""
		if row.ok != nil {
			verdict = map[bool]string{true: "met", false: "**not met**"}[row.ok(m)]
		}
		p("| %s | "+targetFormat+"%s %s | %s | %s |\n", row.what, m, row.unit, rangeOf(row.values, targetFormat), row.target, verdict)
	}
}

// targetsSection is the generated section of BENCHMARKS.md: the targets
// table of this run, with the machine, the command and the load.
func (rep *report) targetsSection() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("<!-- Generated by cmd/inboxbench (make bench, flag -benchmarks-md): everything between the markers is replaced on each run. -->\n\n")
	p("## Targets of issue 14, from the last `make bench`\n\n")
	p("Run `%s`, %s, %s, %s. Load average (1, 5, 15 min): %s at the start, %s at the end.\n\n",
		rep.opts.runID, rep.started.UTC().Format("2006-01-02 15:04 MST"), rep.finished.Sub(rep.started).Round(time.Second), repetitions(rep.opts.reps), rep.loadStart, rep.loadEnd)
	for _, m := range rep.machine {
		p("- %s\n", m)
	}
	p("\nCommand: `inboxbench %s`\n\n", strings.Join(redactArgs(rep.opts.args), " "))
	p("Every ratio is taken within a repetition (both variants of the same repetition), then the median over the repetitions is given, with their range in brackets; a target is met when the median meets it. Throughputs are those of the router tables; the Redis CPU row divides the Redis server's CPU time per message. \"not run\": the flags of the run left out a variant, broker, concurrency or section that the row needs.\n\n")
	rep.targetsTable(&b)
	return b.String()
}

// replaceSection returns doc with the lines between the marker lines (a
// line that is exactly sectionBegin, a later one that is exactly
// sectionEnd) replaced by section, or, when doc has neither, doc with the
// section and its markers appended. Markers quoted inside other lines (as
// BENCHMARKS.md quotes them in prose) are not markers. A marker line
// without its pair, more than one of either, or the end before the
// beginning is an error: the section cannot be told from the rest.
func replaceSection(doc, section string) (string, error) {
	block := sectionBegin + "\n" + section
	if !strings.HasSuffix(block, "\n") {
		block += "\n"
	}
	block += sectionEnd
	begins, ends := markerLines(doc, sectionBegin), markerLines(doc, sectionEnd)
	switch {
	case len(begins) == 0 && len(ends) == 0:
		if doc != "" && !strings.HasSuffix(doc, "\n") {
			doc += "\n"
		}
		if doc != "" {
			doc += "\n"
		}
		return doc + block + "\n", nil
	case len(begins) != 1 || len(ends) != 1 || ends[0] < begins[0]:
		return "", fmt.Errorf("want one line %s and one later line %s; found %d and %d", sectionBegin, sectionEnd, len(begins), len(ends))
	}
	return doc[:begins[0]] + block + doc[ends[0]+len(sectionEnd):], nil
}

// markerLines returns the offsets in doc of the lines that are exactly
// marker.
func markerLines(doc, marker string) []int {
	var at []int
	for off := 0; off < len(doc); {
		line, _, _ := strings.Cut(doc[off:], "\n")
		if strings.TrimRight(line, "\r") == marker {
			at = append(at, off)
		}
		off += len(line) + 1
	}
	return at
}

// writeSection puts section into the markdown file at path (see
// replaceSection), creating the file if need be.
func writeSection(path, section string) error {
	doc, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	out, err := replaceSection(string(doc), section)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(out), 0o644)
}

// repetitions is "1 repetition", "7 repetitions".
func repetitions(n int) string {
	if n == 1 {
		return "1 repetition"
	}
	return fmt.Sprintf("%d repetitions", n)
}
