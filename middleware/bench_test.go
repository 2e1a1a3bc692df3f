package middleware_test

import (
	"context"
	"math"
	"strconv"
	"sync/atomic"
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
			ib, err := middleware.New(middleware.Config{Store: s, Bus: "bench", Group: "g", Alias: keying.StaticAlias("h")})
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

func benchMessages(n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage("uuid-"+strconv.Itoa(i), []byte(`{"order":`+strconv.Itoa(i)+`,"amount":42}`))
		msgs[i].SetContext(context.Background())
	}
	return msgs
}

// BenchmarkMiddleware calls the wrapped handler as the router does (handler,
// then Ack) for distinct messages. The inbox's marks land asynchronously
// after the ack; Close drains them inside the timed region, so their cost
// counts.
func BenchmarkMiddleware(b *testing.B) {
	for _, name := range []string{"none", "watermill-deduplicator", "inbox-memory"} {
		b.Run(name, func(b *testing.B) {
			mw, closeFn := contenders(b)[name]()
			h := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
			msgs := benchMessages(b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := h(msgs[i]); err != nil {
					b.Fatal(err)
				}
				msgs[i].Ack()
			}
			closeFn()
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
			msgs := benchMessages(b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for _, m := range msgs {
				if err := ps.Publish("orders", m); err != nil {
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
		})
	}
}
