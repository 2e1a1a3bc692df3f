package inboxkafka_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// A consumer group that restarts from the earliest offset after its
// committed offsets expired replays records older than the store's
// retention: with the record timestamp, the inbox refuses them
// (StaleReject) instead of running their handlers again unchecked.
func ExampleTimestamp() {
	store, err := memory.New(memory.Options{}) // retention: 7 days
	if err != nil {
		panic(err)
	}
	defer store.Close()
	ib, err := inboxmw.New(inboxmw.Config{
		Store:     store,
		Bus:       "kafka",
		Group:     "billing",
		Timestamp: inboxkafka.Timestamp,
		Stale:     inboxmw.StaleReject, // default StaleWarn: logged and counted, then handled
	})
	if err != nil {
		panic(err)
	}
	defer ib.Close(context.Background())

	_, ok := inboxkafka.Timestamp(message.NewMessage("m-1", nil))
	fmt.Println("a message built by hand has a record timestamp:", ok)
	// Output: a message built by hand has a record timestamp: false
}
