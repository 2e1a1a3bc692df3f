package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/internal/readme"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
)

// TestRun runs the example twice against the local RabbitMQ with the default
// store (a SQLite file in the working directory), as repeated
// `go run ./examples/rabbit` would: each run charges every order once, skips
// the duplicates, retries the failed charge, sends the poison order to the
// poison queue after 3 attempts, and the second run is not confused by the
// first one's queues or keys. The failed charges wait in RabbitMQ delay
// queues, deleted at the end too.
func TestRun(t *testing.T) {
	amqpURL := testenv.RabbitMQ.URL(t)
	t.Chdir(t.TempDir())
	storeURL := DefaultStoreURL
	for run := 1; run <= 2; run++ {
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		sum, err := Run(ctx, Config{AMQPURL: amqpURL, StoreURL: storeURL, Timeout: time.Minute}, &out)
		cancel()
		if err != nil {
			t.Fatalf("run %d: %v\n%s", run, err, out.String())
		}
		want := Summary{Published: 9, Orders: 6, Received: 12, Processed: 5, Duplicates: 3, Retried: 3, Dead: 1}
		if sum != want {
			t.Errorf("run %d: summary %+v, want %+v\n%s", run, sum, want, out.String())
		}
		got := out.String()
		var queue string
		if _, err := fmt.Sscanf(got[strings.Index(got, "queue "):], "queue %s", &queue); err != nil {
			t.Fatalf("run %d: output does not name the queue: %v\n%s", run, err, got)
		}
		queue = strings.TrimSuffix(queue, ",")
		for _, line := range []string{
			"order-3  failed: payment gateway timeout",
			`order-6  dead: moved to the poison queue and acked (inbox: key "rabbit:` + queue + `:charge-card:order-6" is dead after 3 attempts: card number missing from the order)`,
			"published 9 messages for 6 orders",
			"received 12, processed 5, duplicates skipped 3, retried 3, dead 1",
			"forget 'rabbit:" + queue + ":charge-card:order-6'",
			"deleted queue " + queue + "-poison, which held 1 message(s)",
		} {
			if !strings.Contains(got, line) {
				t.Errorf("run %d: output lacks %q:\n%s", run, line, got)
			}
		}
		if n := strings.Count(got, "times charged: 1"); n != 5 {
			t.Errorf("run %d: %d orders charged, want 5:\n%s", run, n, got)
		}
		if n := strings.Count(got, "order-6  failed: card number missing from the order"); n != 2 {
			t.Errorf("run %d: the poison order failed %d times before it died, want 2:\n%s", run, n, got)
		}
		// A failed charge is handed to the delay queues, unless its backoff
		// (random) is below RedeliveryMinDelay: then RabbitMQ redelivers it
		// at once and it waits in the consumer.
		for _, line := range strings.Split(got, "\n") {
			if !strings.Contains(line, "  failed: ") || strings.Contains(line, "; handed to a RabbitMQ delay queue, delivered again after its backoff") {
				continue
			}
			var backoff time.Duration
			if i := strings.Index(line, "holds it back for "); i < 0 {
				t.Errorf("run %d: a failure neither handed off nor held back: %q", run, line)
			} else if backoff, err = time.ParseDuration(strings.TrimSuffix(strings.Fields(line[i+len("holds it back for "):])[0], ",")); err != nil || backoff >= inboxmw.DefaultRedeliveryMinDelay {
				t.Errorf("run %d: a failure with a backoff of %s (%v) was not handed off: %q", run, backoff, err, line)
			}
		}
		if strings.Contains(got, "times charged: 2") || strings.Contains(got, "could not delete queue") {
			t.Errorf("run %d: an order was charged twice or a queue stayed:\n%s", run, got)
		}
		for _, q := range []string{queue, queue + "-poison", inboxamqp.DelayQueueName(queue, inboxamqp.DefaultDelays[0])} {
			if queueExists(t, amqpURL, q) {
				t.Errorf("run %d: queue %s was not deleted", run, q)
			}
		}
	}
	if _, err := os.Stat("inbox-example.db"); err != nil {
		t.Errorf("the default store file is missing: %v", err)
	}
}

// TestRun_store_url_password_is_not_printed checks that the store URL is
// printed redacted, and that a bad one fails before anything is published.
func TestRun_store_url_password_is_not_printed(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	_, err := Run(context.Background(), Config{AMQPURL: "amqp://127.0.0.1:1/", StoreURL: "redis://:s3cret@127.0.0.1:6379/0?bogus=1", Timeout: time.Second}, &out)
	if err == nil {
		t.Fatal("a store URL with an unknown parameter was accepted")
	}
	if !strings.Contains(err.Error(), "bogus") {
		t.Errorf("error %q does not name the bad parameter", err)
	}
	if strings.Contains(err.Error()+out.String(), "s3cret") {
		t.Errorf("the password was printed: %v\n%s", err, out.String())
	}
}

// queueExists reports whether RabbitMQ has the queue.
func queueExists(t *testing.T, amqpURL, queue string) bool {
	t.Helper()
	conn, err := amqp091.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	_, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var ae *amqp091.Error
	if errors.As(err, &ae) && ae.Code == amqp091.NotFound {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// TestREADME_summary runs the README's command for this example, `go run
// ./examples/rabbit` (built, then run in a directory of its own, where the
// default store file goes), with AMQP_URL the test RabbitMQ, and wants the README's
// summary lines, one after the other, in what it prints.
func TestREADME_summary(t *testing.T) {
	t.Parallel()
	amqpURL := testenv.RabbitMQ.URL(t)
	const command = "$ go run ./examples/rabbit"
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
	bin := filepath.Join(dir, "rabbit")
	build := exec.Command("go", "build", "-o", bin, "./examples/rabbit")
	build.Dir = readme.Root(t)
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
	cmd.Env = append(cmd.Env, "AMQP_URL="+amqpURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", command, err, out)
	}
	if want := strings.Join(summary, "\n") + "\n"; !strings.Contains(string(out), "\n"+want) {
		t.Fatalf("%s printed:\n%s\nwithout the README's lines:\n%s", command, out, want)
	}
}
