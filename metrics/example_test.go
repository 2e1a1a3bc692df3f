package inboxmetrics_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/metrics"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// Export a store's batch sizes; any store of this project will do (this
// memory store sends every call alone).
func ExampleRegisterStore() {
	store, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	reg := prometheus.NewRegistry()
	if err := inboxmetrics.RegisterStore(reg, "", store, prometheus.Labels{"store": "orders"}); err != nil {
		panic(err)
	}
	ctx := context.Background()
	c, _ := store.TryBegin(ctx, "kafka:billing:charge:m-1", inbox.BeginOptions{})
	_ = store.Complete(ctx, "kafka:billing:charge:m-1", c.LeaseID)

	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if h := mf.GetMetric()[0].GetHistogram(); h != nil {
			fmt.Printf("%s: %d round trips, %.0f calls\n", mf.GetName(), h.GetSampleCount(), h.GetSampleSum())
		}
	}
	// Output: watermill_inbox_store_batch_size: 2 round trips, 2 calls
}
