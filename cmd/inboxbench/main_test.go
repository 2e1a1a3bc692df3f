package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox/internal/testenv"
)

// TestRun_smoke runs every section of the harness with tiny sizes (two
// repetitions, a few dozen messages per trial) and checks that the report
// and the chart hold every variant. It measures nothing; `make bench` does.
func TestRun_smoke(t *testing.T) {
	amqpURL := testenv.RabbitMQ.URL(t)
	redisURL := testenv.Redis.URL(t)
	pgURL := testenv.Postgres.URL(t)
	dir := t.TempDir()
	md, svg := filepath.Join(dir, "bench.md"), filepath.Join(dir, "chart.svg")
	o, err := parseFlags([]string{
		"-reps", "2", "-n", "40", "-scale-n", "40", "-kafka-n", "40", "-kafka-scale-n", "40",
		"-consumers", "1,2", "-micro-n", "500",
		"-roundtrip-stores", "redis", "-roundtrip-scale", "0.01",
		"-amqp", amqpURL, "-redis", redisURL, "-postgres", pgURL, "-kafka", "",
		"-md", md, "-svg", svg,
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
		"## Scaling with concurrent consumers", "| 1 consumer | 2 consumers |",
		"## Middleware cost per message", "## Store round trips", "| redis | 30 |",
		"Load average", "RabbitMQ ",
		"| variant | msg/s | ratio to none | CPU µs/msg | Redis CPU µs/msg |", "Redis CPU µs/msg, 2 consumers |",
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
	ro, err := redis.ParseURL(testenv.Redis.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(ro)
	defer c.Close()
	prefix := "inboxbench-test:" + strings.ToLower(watermill.NewShortUUID()) + ":"
	defer func() { _ = deletePrefix(context.Background(), c, prefix) }()
	calls := 0
	h := floorRedis(c, prefix, 30*time.Second)(func(*message.Message) ([]*message.Message, error) {
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
}
