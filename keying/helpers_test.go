package keying_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/watermill-inbox/inbox"
)

// consume runs a Watermill router with one handler named handlerName reading
// a GoChannel topic, publishes msgs to it and returns what fn returned for
// each message, in publishing order. fn runs in a router middleware, where
// the inbox middleware computes keys, so the message context is the one the
// router really builds.
func consume[T any](tb testing.TB, handlerName string, msgs []*message.Message, fn func(*message.Message) T) []T {
	tb.Helper()
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		tb.Fatal(err)
	}
	results := make(chan T, len(msgs))
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			results <- fn(msg)
			return h(msg)
		}
	})
	const topic = "keying-test"
	router.AddConsumerHandler(handlerName, topic, pubSub, func(*message.Message) error { return nil })

	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		_ = router.Close()
		if err := <-runErr; err != nil {
			tb.Errorf("router.Run: %v", err)
		}
		_ = pubSub.Close()
	})
	select {
	case <-router.Running():
	case err := <-runErr:
		tb.Fatalf("router stopped before running: %v", err)
	case <-time.After(30 * time.Second):
		tb.Fatal("router not running after 30s")
	}

	out := make([]T, 0, len(msgs))
	for _, msg := range msgs {
		// One at a time: GoChannel delivers in order, and waiting for each
		// result keeps the order whatever the router does.
		if err := pubSub.Publish(topic, msg); err != nil {
			tb.Fatal(err)
		}
		select {
		case r := <-results:
			out = append(out, r)
		case <-time.After(30 * time.Second):
			tb.Fatalf("message %s not consumed after 30s", msg.UUID)
		}
	}
	return out
}

// handlerContext returns the context a router gives to messages consumed by
// a handler named handlerName.
func handlerContext(tb testing.TB, handlerName string) context.Context {
	tb.Helper()
	return consume(tb, handlerName, []*message.Message{message.NewMessage("ctx", nil)},
		func(msg *message.Message) context.Context { return msg.Context() })[0]
}

// wantErr fails t unless err wraps every one of sentinels and its message
// holds every one of parts.
func wantErr(t testing.TB, err error, sentinels []error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("error = nil, want one wrapping %v and holding %q", sentinels, parts)
	}
	for _, s := range sentinels {
		if !errors.Is(err, s) {
			t.Errorf("error %q does not wrap %q", err, s)
		}
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not hold %q", err, p)
		}
	}
}

var (
	invalidKey = []error{inbox.ErrInvalidKey, inbox.ErrInvalidArgument}
	invalidArg = []error{inbox.ErrInvalidArgument}
	noKey      = []error{inbox.ErrNoKey}
)
