package inboxmw_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/startstest"
	"github.com/watermill-inbox/inbox/stores/remote"
	"github.com/watermill-inbox/inbox/stores/remote/server"
)

// The success path starts no goroutine and no timer per message: the
// counts over 10,000 messages, with a handler that returns nothing and one
// that returns a message (each marked once the router acked it), stay under
// a constant, on the memory store and on the remote store against an
// in-process inboxd (the server's goroutines counted too). The
// Redis, SQL and MongoDB stores run the same count in their own tests.
// (Before the keeper, each message started a goroutine and a timer for its
// lease, and a timer for each store call; before the stores' workers, each
// mark of the remote store started a goroutine of its own.)
func TestInbox_success_path_starts_no_goroutine_or_timer_per_message(t *testing.T) {
	// Not parallel: the counts are the whole process's.
	for name, h := range map[string]message.HandlerFunc{"no output": ok, "an output": okWithOutput} {
		t.Run("memory/"+name, func(t *testing.T) {
			startstest.Constant(t, newMemory(t), "starts", h, startstest.Messages)
		})
	}
	t.Run("remote", func(t *testing.T) {
		h, err := server.New(server.Config{Store: newMemory(t), LeaseMin: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		store, err := remote.New(remote.Options{URL: "http://127.0.0.1:1", HTTPClient: &http.Client{Transport: serveDirect{h}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		// Goroutines only: the heap profiling that counts timers makes
		// this run take minutes. Each request has one timer, the
		// client's Options.Timeout of an HTTP attempt (the server's
		// StoreTimeout makes none: its request's context ends sooner).
		g := startstest.Goroutines(t, store, "starts", nil, startstest.Messages)
		t.Logf("%d messages started %d goroutines", startstest.Messages, g)
		if g > startstest.Bound {
			t.Fatalf("%d messages started %d goroutines, want at most %d", startstest.Messages, g, startstest.Bound)
		}
	})
}

// serveDirect is an http.RoundTripper that hands each request to an
// in-process inboxd's handler, without a socket: net/http's server starts
// a goroutine per request (its background read of the connection), which
// a real inboxd pays in its own process, not the consumer's.
type serveDirect struct{ h http.Handler }

func (d serveDirect) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	d.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}
