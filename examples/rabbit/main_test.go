package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox/internal/testenv"
)

// TestRun runs the example twice against the local RabbitMQ with the default
// store (a SQLite file in the working directory), as repeated
// `go run ./examples/rabbit` would: each run charges every order once, skips
// the duplicates, retries the failed charge, sends the poison order to the
// poison queue after 3 attempts, and the second run is not confused by the
// first one's queues or keys.
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
		if strings.Contains(got, "times charged: 2") || strings.Contains(got, "could not delete queue") {
			t.Errorf("run %d: an order was charged twice or a queue stayed:\n%s", run, got)
		}
		for _, q := range []string{queue, queue + "-poison"} {
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
