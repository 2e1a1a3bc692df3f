package inboxmw_test

import (
	"context"
	"math"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// The three contenders of the benchmarks, each wrapping the same handler.
func contenders(b *testing.B) map[string]func() (message.HandlerMiddleware, func()) {
	return map[string]func() (message.HandlerMiddleware, func()){
		"none": func() (message.HandlerMiddleware, func()) {
			return func(h message.HandlerFunc) message.HandlerFunc { return h }, func() {}
		},
		"watermill-deduplicator": func() (message.HandlerMiddleware, func()) {
			d := &wmw.Deduplicator{KeyFactory: wmw.NewMessageHasherAdler32(math.MaxInt64)}
			return d.Middleware, func() {}
		},
		"inbox-memory": func() (message.HandlerMiddleware, func()) {
			s, err := memory.New(memory.Options{})
			if err != nil {
				b.Fatal(err)
			}
			ib, err := inboxmw.New(inboxmw.Config{Store: s, Bus: "bench", Group: "g", Alias: keying.StaticAlias("h")})
			if err != nil {
				b.Fatal(err)
			}
			return ib.Middleware, func() {
				if err := ib.Close(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		},
	}
}

var benchPayload = []byte(`{"order":12345,"amount":42}`)

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkMiddleware calls the wrapped handler as the router does (handler,
// then Ack) for distinct messages, each with a cancelable context of its own
// as subscribers give them. The inbox's marks land asynchronously
// after the ack; Close drains them inside the timed region, so their cost
// counts. Each iteration creates its message, a cost "none" pays too: the
// overhead of a contender is its time minus none's. cpu-ns/op is the
// process's CPU time per message (all goroutines, GC included): steadier than
// ns/op on a shared machine.
func BenchmarkMiddleware(b *testing.B) {
	for _, name := range []string{"none", "watermill-deduplicator", "inbox-memory"} {
		b.Run(name, func(b *testing.B) {
			mw, closeFn := contenders(b)[name]()
			h := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
			ctx := context.Background()
			b.ReportAllocs()
			cpu0 := cpuTime()
			b.ResetTimer()
			for i := range b.N {
				m := message.NewMessage(strconv.Itoa(i), benchPayload)
				// A context of its own, canceled after the ack, as
				// watermill-amqp and watermill-kafka give each message.
				mctx, cancel := context.WithCancel(ctx)
				m.SetContext(mctx)
				if _, err := h(m); err != nil {
					b.Fatal(err)
				}
				m.Ack()
				cancel()
			}
			closeFn()
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkRouter measures a whole Watermill router on GoChannel: publish
// b.N messages, wait until the handler saw them all.
func BenchmarkRouter(b *testing.B) {
	for _, name := range []string{"none", "watermill-deduplicator", "inbox-memory"} {
		b.Run(name, func(b *testing.B) {
			mw, closeFn := contenders(b)[name]()
			ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(b.N)}, watermill.NopLogger{})
			defer ps.Close()
			r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			if err != nil {
				b.Fatal(err)
			}
			var seen atomic.Int64
			done := make(chan struct{})
			total := int64(b.N)
			r.AddMiddleware(mw)
			r.AddConsumerHandler("h", "orders", ps, func(*message.Message) error {
				if seen.Add(1) == total {
					close(done)
				}
				return nil
			})
			go func() { _ = r.Run(context.Background()) }()
			<-r.Running()
			b.ReportAllocs()
			cpu0 := cpuTime()
			b.ResetTimer()
			for i := range b.N {
				if err := ps.Publish("orders", message.NewMessage(strconv.Itoa(i), benchPayload)); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-done:
			case <-time.After(time.Minute):
				b.Fatalf("handled %d of %d", seen.Load(), b.N)
			}
			_ = r.Close()
			closeFn()
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
