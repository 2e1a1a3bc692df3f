package remote_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/remote"
)

// Router tests: the inbox middleware on Watermill's GoChannel with the remote
// client as its store, inboxd over a memory store behind it. GoChannel
// redelivers a nacked message at once. "Nothing marked" is read from the
// backing store directly.

type flow struct {
	ps      *gochannel.GoChannel
	runs    atomic.Int32 // handler runs
	nacks   atomic.Int32 // deliveries that returned an error wrapping ErrStoreUnavailable
	fail    atomic.Bool  // the handler fails
	work    time.Duration
	logs    *watermill.CaptureLoggerAdapter
	backing inbox.LeaseStore
}

func startFlow(t *testing.T, store inbox.LeaseStore, backing inbox.LeaseStore, tune ...func(*inboxmw.Config, *flow)) *flow {
	t.Helper()
	f := &flow{backing: backing, logs: watermill.NewCaptureLogger()}
	f.ps = gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
	cfg := inboxmw.Config{Store: store, Bus: "test", Group: "g", Lease: 3 * time.Second,
		StoreTimeout: 2 * time.Second, MaxBusyWait: -1, Logger: f.logs}
	for _, fn := range tune {
		fn(&cfg, f)
	}
	ib, err := inboxmw.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			if errors.Is(err, inbox.ErrStoreUnavailable) {
				f.nacks.Add(1)
			}
			if err != nil {
				time.Sleep(5 * time.Millisecond) // GoChannel redelivers at once: keep the loop gentle
			}
			return out, err
		}
	})
	r.AddMiddleware(ib.Middleware)
	r.AddConsumerHandler("orders-handler", "orders", f.ps, func(m *message.Message) error {
		f.runs.Add(1)
		time.Sleep(f.work) // simulated work
		if f.fail.Load() {
			return errors.New("handler failed")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	select {
	case <-r.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("router did not start")
	}
	t.Cleanup(func() {
		cancel()
		_ = r.Close()
		<-done
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		_ = ib.Close(cctx)
		_ = f.ps.Close()
	})
	return f
}

func (f *flow) publish(t *testing.T, id string) {
	t.Helper()
	m := message.NewMessage(watermill.NewUUID(), []byte("payload"))
	m.Metadata.Set("IdempotencyKey", id)
	if err := f.ps.Publish("orders", m); err != nil {
		t.Fatal(err)
	}
}

func (f *flow) record(t *testing.T, id string) inbox.Record {
	t.Helper()
	r, err := f.backing.Get(context.Background(), "test:g:orders-handler:"+id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Each fault on the way to the store: the middleware nacks, the handler
// never runs, nothing reaches the backing store; once the fault is gone the
// message is processed once and marked.
func TestRouter_store_faults_nack_and_mark_nothing(t *testing.T) {
	t.Parallel()
	type fault struct {
		name   string
		client func(t *testing.T, r *rig) *remote.Store
		heal   func() // nil: a misconfiguration that stays
	}
	faults := []func(r *rig) fault{
		func(r *rig) fault {
			var px *faultproxy.Proxy
			return fault{"server down", func(t *testing.T, r *rig) *remote.Store {
				px = faultproxy.New(t, strings.TrimPrefix(r.base, "http://"))
				px.Cut()
				c := newClient(t, remote.Options{URL: "http://" + px.Addr(), Token: testToken, Timeout: 300 * time.Millisecond})
				remote.SetDiscoveryRetry(c, 100*time.Millisecond) // heals without waiting 5 s
				return c
			}, func() { px.Restore() }}
		},
		func(r *rig) fault {
			release := make(chan struct{})
			r.in.on("/v1/inbox/try-begin", func(w http.ResponseWriter, req *http.Request, _ http.Handler) {
				select {
				case <-release:
				case <-req.Context().Done():
				}
			})
			var once atomic.Bool
			return fault{"slower than the timeout", nil, func() {
				r.in.on("", nil)
				if once.CompareAndSwap(false, true) {
					close(release)
				}
			}}
		},
		func(r *rig) fault {
			r.in.on("/v1/inbox/try-begin", status(500, `{"error":"internal_error","message":"x"}`))
			return fault{"500s", nil, func() { r.in.on("", nil) }}
		},
		func(r *rig) fault {
			r.in.on("/v1/inbox/try-begin", status(200, `{"status":`))
			return fault{"malformed JSON", nil, func() { r.in.on("", nil) }}
		},
		func(r *rig) fault {
			r.in.on("/v1/inbox/try-begin", status(200, `{"status":"Acquired-ish","leaseId":"x","expiresAt":"2030-01-01T00:00:00Z"}`))
			return fault{"unknown status", nil, func() { r.in.on("", nil) }}
		},
		func(r *rig) fault {
			return fault{"wrong token", func(t *testing.T, r *rig) *remote.Store {
				return newClient(t, remote.Options{URL: r.base, Token: "not-the-token"})
			}, nil}
		},
		func(r *rig) fault {
			return fault{"wrong base path", func(t *testing.T, r *rig) *remote.Store {
				return newClient(t, remote.Options{URL: r.base + "/nope", Token: testToken})
			}, nil}
		},
	}
	for _, mk := range faults {
		r := newRig(t, remote.Options{Timeout: 300 * time.Millisecond})
		fl := mk(r)
		t.Run(fl.name, func(t *testing.T) {
			t.Parallel()
			client := r.client
			if fl.client != nil {
				client = fl.client(t, r)
			}
			f := startFlow(t, client, r.backing)
			f.publish(t, "o-1")
			testenv.Eventually(t, 20*time.Second, "the message nacked twice", func() bool { return f.nacks.Load() >= 2 })
			if n := f.runs.Load(); n != 0 {
				t.Fatalf("handler ran %d times while the store was unreachable", n)
			}
			if rec := f.record(t, "o-1"); rec.State != inbox.StateNotFound {
				t.Fatalf("backing store holds %+v while the client could not reach it", rec)
			}
			if fl.heal == nil {
				return
			}
			fl.heal()
			testenv.Eventually(t, 20*time.Second, "the key marked after healing", func() bool {
				return f.record(t, "o-1").State == inbox.StateProcessed
			})
			if n := f.runs.Load(); n != 1 {
				t.Fatalf("handler ran %d times, want 1", n)
			}
		})
	}
}

// A handler that fails is never marked, even when giving the lease back
// (fail) fails too: the key waits for its lease to end.
func TestRouter_failed_handler_with_failing_fail_is_not_marked(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{Timeout: 300 * time.Millisecond, Retries: -1})
	r.in.on("/v1/inbox/fail", status(500, `{"error":"internal_error","message":"x"}`))
	f := startFlow(t, r.client, r.backing)
	f.fail.Store(true)
	f.publish(t, "o-2")
	testenv.Eventually(t, 10*time.Second, "the fail attempted", func() bool { return r.in.count("/v1/inbox/fail") >= 1 })
	if rec := f.record(t, "o-2"); rec.State == inbox.StateProcessed {
		t.Fatalf("a failed handler's key was marked: %+v", rec)
	}
	f.fail.Store(false)
	r.in.on("", nil)
	testenv.Eventually(t, 20*time.Second, "processed once the lease ran out", func() bool {
		return f.record(t, "o-2").State == inbox.StateProcessed
	})
}

// A mark that fails after a successful handler is retried in the background
// and never runs the handler again.
func TestRouter_failing_mark_is_retried_without_rerun(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{Timeout: 300 * time.Millisecond, Retries: -1})
	var marks atomic.Int32
	r.in.on("/v1/inbox/mark-processed", func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		if marks.Add(1) <= 2 {
			status(503, `{"error":"store_unavailable","message":"x"}`)(w, req, next)
			return
		}
		next.ServeHTTP(w, req)
	})
	f := startFlow(t, r.client, r.backing)
	f.publish(t, "o-3")
	testenv.Eventually(t, 20*time.Second, "marked after two failed marks", func() bool {
		return f.record(t, "o-3").State == inbox.StateProcessed
	})
	if n := f.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// Against a server without the extend extension, the middleware's heartbeat
// gets ErrNotSupported, turns heartbeats off with a log line, and the
// message is still processed.
func TestRouter_server_without_extend_turns_heartbeats_off(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	r.in.on("/v1/inbox", strip())
	f := startFlow(t, r.client, r.backing, func(c *inboxmw.Config, f *flow) {
		c.HeartbeatInterval = 100 * time.Millisecond
		f.work = 400 * time.Millisecond // several heartbeat intervals
	})
	f.publish(t, "o-4")
	testenv.Eventually(t, 10*time.Second, "processed", func() bool { return f.record(t, "o-4").State == inbox.StateProcessed })
	testenv.Eventually(t, 10*time.Second, "the heartbeats-off log line", func() bool {
		for _, l := range f.logs.Captured()[watermill.InfoLogLevel] {
			if strings.Contains(l.Msg, "cannot extend leases: heartbeats off") {
				return true
			}
		}
		return false
	})
	if r.in.count("/v1/inbox/extend") != 0 {
		t.Fatal("Extend reached a server that does not list it")
	}
}
