package inboxkafka_test

import (
	"context"
	"fmt"

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
