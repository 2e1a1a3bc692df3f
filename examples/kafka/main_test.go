package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-inbox/inbox/internal/testenv"
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

// TestRun_embedded runs the example as `go run ./examples/kafka` does without
// KAFKA_BROKERS (an in-process kfake cluster) with the default store, twice
// with one SQLite file: each run charges every order once, skips the
// duplicates, retries the failed charge and moves the poison order to the
// poison topic after 3 attempts.
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
