package main

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox/internal/readme"
	"github.com/watermill-inbox/inbox/internal/testenv"
)

// TestRun runs the example as `go run .` does (an in-process kfake cluster,
// or the cluster of KAFKA_BROKERS when set) against the local RabbitMQ,
// Redis and PostgreSQL: every order is invoiced and emailed once; the stock
// of order-3, whose event's publish was reported failed, is reserved twice,
// and create-invoice drops the second copy of its event (the same derived
// id); the run removes its tables.
func TestRun(t *testing.T) {
	cfg := Config{
		AMQPURL:     testenv.RabbitMQ.URL(t),
		RedisURL:    testenv.Redis.URL(t),
		PostgresURL: testenv.Postgres.URL(t),
		Timeout:     time.Minute,
	}
	if v := os.Getenv("KAFKA_BROKERS"); v != "" {
		cfg.Brokers = strings.Split(v, ",")
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := Run(ctx, cfg, &out)
	got := out.String()
	if err != nil {
		t.Fatalf("%v\n%s", err, got)
	}
	want := Summary{Published: 7, Orders: 5, Reserved: 6, Invoiced: 5, Emailed: 5, DroppedReserve: 2, DroppedInvoice: 1}
	if sum != want {
		t.Errorf("summary %+v, want %+v\n%s", sum, want, got)
	}
	for _, line := range []string{
		"order-3  reserve-stock: stock reserved (times: 2)",
		"published 7 messages for 5 orders",
		"stock reserved 6 times, invoices 5, emails 5; duplicates dropped: reserve-stock 2, create-invoice 1, email-invoice 0",
	} {
		if !strings.Contains(got, line) {
			t.Errorf("output lacks %q:\n%s", line, got)
		}
	}
	// The event create-invoice dropped is the one it invoiced.
	i := strings.Index(got, "order-3  create-invoice: duplicate event ")
	if i < 0 {
		t.Fatalf("create-invoice did not report order-3's duplicate event:\n%s", got)
	}
	event := strings.Fields(got[i:])[4]
	if !strings.Contains(got, "order-3  create-invoice: invoice written with its event, in one transaction (event "+event+")") {
		t.Errorf("the dropped event %s is not the one order-3 was invoiced from:\n%s", event, got)
	}
	for _, order := range []string{"order-1", "order-2", "order-3", "order-4", "order-5"} {
		if n := strings.Count(got, order+"  email-invoice: emailed"); n != 1 {
			t.Errorf("%s emailed %d times, want 1:\n%s", order, n, got)
		}
	}
	if strings.Contains(got, "could not") {
		t.Errorf("the run did not clean up:\n%s", got)
	}
	db, err := sql.Open("pgx", cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var left int
	run := strings.TrimPrefix(strings.Fields(got)[1], "inbox-example-orders-")
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.tables WHERE table_name LIKE '%' || $1 || '%'", run).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d tables of run %s left in PostgreSQL", left, run)
	}
}

// TestREADME_transcript runs the example as the README's transcript does
// (in process, with the services of the tests) and wants the transcript's
// lines, in order, in what it prints: a line "..." stands for lines left
// out, and "..." inside a line for the part that changes from run to run
// (the event's derived id, which the run's queue names go into).
func TestREADME_transcript(t *testing.T) {
	const command = "$ cd examples/pipeline && go run ."
	var want []string
	found := false
	for _, l := range readme.RunBy(t)[0].Lines() {
		switch {
		case strings.HasPrefix(l, command):
			found = true
		case strings.HasPrefix(l, "$ "), l == "...":
		default:
			want = append(want, l)
		}
	}
	if !found || len(want) == 0 {
		t.Fatalf("the README's block has no %q line or no output", command)
	}
	cfg := Config{
		AMQPURL:     testenv.RabbitMQ.URL(t),
		RedisURL:    testenv.Redis.URL(t),
		PostgresURL: testenv.Postgres.URL(t),
		Timeout:     time.Minute,
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := Run(ctx, cfg, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lines := strings.Split(out.String(), "\n")
	next := 0
	for _, w := range want {
		prefix, suffix, wild := strings.Cut(w, "...")
		matched := false
		for ; next < len(lines) && !matched; next++ {
			l := lines[next]
			matched = l == w || (wild && len(l) > len(prefix)+len(suffix) && strings.HasPrefix(l, prefix) && strings.HasSuffix(l, suffix))
		}
		if !matched {
			t.Errorf("the output lacks the README's line %q after the lines before it:\n%s", w, out.String())
			return
		}
	}
}
