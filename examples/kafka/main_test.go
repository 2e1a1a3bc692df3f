package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-inbox/inbox/internal/readme"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
)

var want = Summary{Published: 9, Orders: 6, Received: 12, Processed: 5, Duplicates: 3, Retried: 3, Dead: 1}

func check(t *testing.T, name string, sum Summary, out string) {
	t.Helper()
	if sum != want {
		t.Errorf("%s: summary %+v, want %+v\n%s", name, sum, want, out)
	}
	topic, group := names(t, out)
	for _, line := range []string{
		"order-3  failed: payment gateway timeout",
		`order-6  dead: moved to the poison topic and acked (inbox: key "kafka:` + group + `:charge-card:order-6" is dead after 3 attempts: card number missing from the order)`,
		"published 9 messages for 6 orders",
		"received 12, processed 5, duplicates skipped 3, retried 3, dead 1",
		"poison topic " + topic + "-poison holds 1 message(s)",
		"forget 'kafka:" + group + ":charge-card:order-6'",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("%s: output lacks %q:\n%s", name, line, out)
		}
	}
	if n := strings.Count(out, "times charged: 1"); n != 5 || strings.Contains(out, "times charged: 2") {
		t.Errorf("%s: want 5 orders charged once each:\n%s", name, out)
	}
	if n := strings.Count(out, "order-6  failed: card number missing from the order"); n != 2 {
		t.Errorf("%s: the poison order failed %d times before it died, want 2:\n%s", name, n, out)
	}
	// A failed charge is handed to the retry topics, unless its backoff
	// (random) is below RedeliveryMinDelay: then watermill-kafka resends it
	// at once and it waits in the consumer.
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "  failed: ") || strings.Contains(line, "; handed to a retry topic, delivered again after its backoff") {
			continue
		}
		i := strings.Index(line, "holds it back for ")
		if i < 0 {
			t.Errorf("%s: a failure neither handed off nor held back: %q", name, line)
			continue
		}
		backoff, err := time.ParseDuration(strings.TrimSuffix(strings.Fields(line[i+len("holds it back for "):])[0], ","))
		if err != nil || backoff >= inboxmw.DefaultRedeliveryMinDelay {
			t.Errorf("%s: a failure with a backoff of %s (%v) was not handed off: %q", name, backoff, err, line)
		}
	}
}

// names returns the topic and the consumer group the output names.
func names(t *testing.T, out string) (topic, group string) {
	t.Helper()
	i := strings.Index(out, "topic ")
	if i < 0 {
		t.Fatalf("output does not name the topic and group:\n%s", out)
	}
	if _, err := fmt.Sscanf(out[i:], "topic %s consumer group %s", &topic, &group); err != nil {
		t.Fatalf("output does not name the topic and group: %v\n%s", err, out)
	}
	return strings.TrimSuffix(topic, ","), group
}

// TestRun_embedded runs the example as `go run .` does without KAFKA_BROKERS
// (an in-process kfake cluster) with the default store, twice with one
// SQLite file: each run charges every order once, skips the duplicates,
// retries the failed charge (through the retry topics) and moves the poison
// order to the poison topic after 3 attempts.
func TestRun_embedded(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, name := range []string{"run 1", "run 2"} {
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		sum, err := Run(ctx, Config{StoreURL: DefaultStoreURL, Timeout: time.Minute}, &out)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out.String())
		}
		if !strings.Contains(out.String(), "started an in-process kfake cluster") {
			t.Errorf("%s: no embedded cluster:\n%s", name, out.String())
		}
		check(t, name, sum, out.String())
	}
	if _, err := os.Stat("inbox-example.db"); err != nil {
		t.Errorf("the default store file is missing: %v", err)
	}
}

// TestRun_given_brokers runs the example against brokers it is given, as with
// KAFKA_BROKERS set: a real cluster when KAFKA_BROKERS names one, else a
// kfake cluster started by the test and standing in for it. It checks that
// the run deletes its topic and consumer group afterwards.
func TestRun_given_brokers(t *testing.T) {
	t.Parallel()
	brokers, ok := testenv.Kafka.Available()
	var list []string
	if ok {
		list = strings.Split(brokers, ",")
	} else {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cluster.Close)
		list = cluster.ListenAddrs()
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := Run(ctx, Config{Brokers: list, StoreURL: "memory://", Timeout: time.Minute}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	check(t, "given brokers", sum, out.String())
	if strings.Contains(out.String(), "kfake") || strings.Contains(out.String(), "could not delete") {
		t.Errorf("unexpected output:\n%s", out.String())
	}

	admin, err := sarama.NewClusterAdmin(list, sarama.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	topics, err := admin.ListTopics()
	if err != nil {
		t.Fatal(err)
	}
	groups, err := admin.ListConsumerGroups()
	if err != nil {
		t.Fatal(err)
	}
	topic, group := names(t, out.String())
	for _, tp := range []string{topic, topic + "-poison"} {
		if _, ok := topics[tp]; ok {
			t.Errorf("topic %s was not deleted", tp)
		}
	}
	if _, ok := groups[group]; ok {
		t.Errorf("consumer group %s was not deleted", group)
	}
}

func TestRun_bad_store_url_names_the_parameter(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	_, err := Run(context.Background(), Config{StoreURL: "postgres://app:s3cret@127.0.0.1:1/db?tabel=x", Timeout: time.Second}, &out)
	if err == nil || !strings.Contains(err.Error(), "tabel") {
		t.Fatalf("error %v does not name the unknown parameter", err)
	}
	if strings.Contains(err.Error()+out.String(), "s3cret") {
		t.Errorf("the password was printed: %v\n%s", err, out.String())
	}
}

// TestREADME_summary runs the README's command for this example, `cd
// examples/kafka && go run .` (built in examples/kafka, a module of its own,
// then run in a directory of its own, where the default store file goes),
// with KAFKA_BROKERS unset (an in-process kfake cluster), and wants the
// README's summary lines, one after the other, in what it prints.
func TestREADME_summary(t *testing.T) {
	t.Parallel()
	const command = "$ cd examples/kafka && go run ."
	var summary []string
	found := false
	for _, l := range readme.RunBy(t)[0].Lines() {
		switch {
		case strings.HasPrefix(l, command+" "):
			found = true
		case strings.HasPrefix(l, "$ "), l == "...":
		default:
			summary = append(summary, l)
		}
	}
	if !found || len(summary) == 0 {
		t.Fatalf("the README's block has no %q line or no summary", command)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "kafka")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join(readme.Root(t), "examples", "kafka")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); name != "INBOX_STORE_URL" && name != "KAFKA_BROKERS" && name != "AMQP_URL" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", command, err, out)
	}
	if want := strings.Join(summary, "\n") + "\n"; !strings.Contains(string(out), "\n"+want) {
		t.Fatalf("%s printed:\n%s\nwithout the README's lines:\n%s", command, out, want)
	}
}
