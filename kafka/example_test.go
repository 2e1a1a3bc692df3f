package inboxkafka_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// The offset is a fallback: the producer's IdempotencyKey and the Watermill
// UUID come first, so producer retries that carry an id are still caught.
func ExampleFromOffset() {
	store, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	cfg := inboxmw.Config{
		Store:     store,
		Bus:       "kafka",
		Group:     "billing", // the consumer group
		IDSources: append(keying.DefaultIDSources(), inboxkafka.FromOffset()),
	}
	ib, err := inboxmw.New(cfg)
	if err != nil {
		panic(err)
	}
	defer ib.Close(context.Background())
	for _, s := range cfg.IDSources {
		fmt.Println(s.Name())
	}
	// Output:
	// metadata:IdempotencyKey
	// uuid
	// kafka-offset
}

// With the record key as the order key, the records of one key run in
// their partition's order, also when one fails and its retry waits in a
// retry topic (Redelivery, inboxkafka.NewRetry): the later ones wait
// behind it. The store must keep order; one that does not is refused.
func ExampleOrderByRecordKey() {
	store, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	ib, err := inboxmw.New(inboxmw.Config{
		Store:    store,
		Bus:      "kafka",
		Group:    "ledger",
		OrderKey: inboxkafka.OrderByRecordKey,
		// Redelivery: a *inboxkafka.Retry, so that a failed record's
		// backoff waits in a retry topic instead of the partition.
	})
	if err != nil {
		panic(err)
	}
	defer ib.Close(context.Background())

	_, err = inboxmw.New(inboxmw.Config{Store: plainStore{store}, Bus: "kafka", Group: "ledger", OrderKey: inboxkafka.OrderByRecordKey})
	fmt.Println(errors.Is(err, inbox.ErrNotSupported))
	// Output:
	// true
}

// plainStore hides every method of a store but the ADR's two: a store that
// keeps no order.
type plainStore struct{ inbox.Store }
