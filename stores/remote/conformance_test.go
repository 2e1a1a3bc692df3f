package remote_test

import (
	"net/url"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/stores/remote"
	"github.com/watermill-inbox/inbox/stores/remote/server"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

// harness runs the suite through the remote client against inboxd's handler
// on loopback HTTP, over the backing store newBacking returns. The fault
// cases break the link between the client and inboxd.
func harness(newBacking func(t *testing.T, cfg storetest.Config) inbox.LeaseStore) storetest.Harness {
	return storetest.Harness{
		New: func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
			base := serve(t, server.Config{Store: newBacking(t, cfg), Retention: cfg.Retention, LeaseMin: time.Second, AdminNoAuth: true})
			return newClient(t, remote.Options{URL: base})
		},
		Faults: func(t *testing.T, cfg storetest.Config) (inbox.LeaseStore, storetest.Link) {
			base, err := url.Parse(serve(t, server.Config{Store: newBacking(t, cfg), Retention: cfg.Retention, LeaseMin: time.Second, AdminNoAuth: true}))
			if err != nil {
				t.Fatal(err)
			}
			p := faultproxy.New(t, base.Host)
			base.Host = p.Addr()
			return newClient(t, remote.Options{URL: base.String()}), p
		},
		// leaseSeconds counts whole seconds.
		Lease:     time.Second,
		Retention: time.Second,
		// RFC 3339 with nanosecond fractions carries the store's own precision.
		TimePrecision: time.Millisecond,
	}
}

func TestConformance_memory(t *testing.T) {
	storetest.Run(t, harness(func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
		return newMemory(t, cfg.Retention)
	}))
}
